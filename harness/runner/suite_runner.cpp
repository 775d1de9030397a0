/*
 * suite_runner: the conformance suite's own ExecuTorch runner.
 *
 * Why it exists: upstream's qnn_executor_runner runs one method per process and reports only an average
 * time, so state can never cross methods and no single step can be timed. This runner executes a whole
 * step plan in ONE process on executorch's public Module API, so what one step (of any method) leaves in
 * the program's state is what the next step sees, exactly as an application holding one Module does.
 *
 * Usage:
 *   suite_runner --model_path M.pte --plan_path plan.txt --output_folder_path OUT
 *                [--log_level N] [--performance_mode N] [--share_memory_arenas] [--shared_buffer]
 *                [--etdump_path FILE] [--reference_model_path R.pte]
 *
 * Step plan (a strict, line-based text file; '#' starts a comment line, blank lines are ignored):
 *   qnnsuite-plan 1                      first meaningful line: the format and its version
 *   step METHOD [INPUT_FILE ...]         one line per execute, in order; METHOD is a method of the program
 *                                        (or @N: its Nth method in program order, as upstream's --method_index),
 *                                        each INPUT_FILE holds one input's raw bytes (the tensor's dtype, in
 *                                        its dim order, little-endian), as many files as the method has inputs.
 *   reload                               the program is loaded again (a fresh Module, every method reloaded,
 *                                        its state the program's initial one) before the next step: an
 *                                        application's "fresh load" reset, mid-plan (harness/pipeline/drivers.py)
 * Relative input paths are resolved against the plan file's folder. File names cannot hold whitespace.
 * Every step and every file is checked (method exists, input count, each file's size against the method's
 * input tensor meta) before any method is loaded, so a bad plan fails without starting the backend.
 *
 * Outputs: step S's output K is written to OUT/output_S_K.raw (raw bytes, the same naming as the harness's
 * emulated runner: harness/emulator/host_runner.py), right after that step's execute. Non-tensor outputs are
 * written as int64 (Int), float64 (Double) or one byte (Bool).
 *
 * Stdout, one line each:
 *   runner: heap pattern 0xNN|none              first: the byte this process's fresh heap allocations hold (below)
 *   runner: load method METHOD load_us N        once per distinct method of the plan, before the first step
 *   step S method METHOD execute_us N peak_rss_kb K   per execute (wall time of Module::execute, inputs
 *                                                included; the process's peak RSS once it returned, below)
 *   runner: peak_rss_kb N                        at the end (getrusage(RUSAGE_SELF).ru_maxrss)
 *   runner: etdump_bytes N                       with --etdump_path, once the ETDump is written
 *   runner: reference load_us N                  with --reference_model_path, once, before the first step
 *   runner: reference after step S execute_us N  with --reference_model_path, after step S's outputs are written
 *
 * Errors: one line on stderr starting "suite_runner: error: " that names the problem and the fix, and a
 * distinct exit code (executorch's own log lines may precede it for load or execute failures):
 *   2 usage (unknown or missing argument)       3 plan file unreadable or malformed
 *   4 program missing or not loadable            5 a step names a method the program does not have
 *   6 an input file is missing or unreadable     7 input count or an input file's size does not match the method
 *   8 load_method failed                         9 execute failed
 *  10 an output could not be written            11 a backend option was rejected or is unavailable
 *
 * Per-step RSS: getrusage(RUSAGE_SELF).ru_maxrss, read after the step's clock stopped (so never in its
 * execute_us): one system call with no file, so it works where /proc/self/statm cannot be read (the emulated
 * device's jail has no /proc) and on Android alike, and it is the same measure as the final peak_rss_kb line.
 * A peak, not the current RSS: it never falls, so a leak shows as a rise that does not stop, which the
 * harness's horizon judgement (harness/horizon.py) reads as a slope over the second half of a long plan.
 * Heap pattern: what a delegated buffer that is never initialised reads (docs/FINDINGS.md#F1). glibc fills
 * fresh allocations with MALLOC_PERTURB_ ^ 0xff (the emulated device starts its commands so); the runner reports
 * that byte only when every probe allocation (64 B, 4 KB, 1 MB) holds nothing else, else "none" (a zero heap
 * without the switch is luck, not a pattern). The same rule as harness/emulator/host_runner.py heap_pattern.
 * QNN backend options: executorch 1.5.1 exposes runtime options through the public
 * executorch::runtime::set_option("QnnBackend", ...) (runtime/backend/interface.h). The QNN backend reads the
 * int keys "qnn_runtime_log_level" (0 off .. 5 debug) and "qnn_runtime_htp_performance_mode" (0 default ..
 * 8 balanced, QnnExecuTorchHtpPerformanceMode) at method load; they override what the program was compiled
 * with. They are set only when given on the command line. The wheel ships no QNN backend headers, so the keys
 * are spelled here (upstream: backends/qualcomm/runtime/QnnExecuTorch.h).
 * Shared buffers: the wheel's libexecutorch_backend_qnn.so exports QnnExecuTorchAllocCustomMem (declared here,
 * as upstream's header does). A program lowered for shared buffers (compiler spec shared_buffer=True, memory
 * planning with alloc_graph_input/alloc_graph_output off, as upstream's export_utils.py builds it) leaves its
 * inputs and outputs unplanned: the application supplies their memory. This runner supplies every unplanned
 * output (Module::set_output) and every input. With --shared_buffer that memory comes from the QNN shared
 * allocator (rpcmem), which the QNN backend registers with QNN instead of copying; when it cannot allocate the
 * runner stops with exit 11 rather than silently using ordinary memory. executorch loads rpcmem
 * (libcdsprpc.so) only in Android builds (backends/qualcomm/runtime/SharedBuffer.cpp, __ANDROID__); elsewhere
 * QnnExecuTorchAllocCustomMem calls a null rpcmem_alloc and crashes (docs/FINDINGS.md#F20), so a build for
 * another OS (the host simulator's) supplies ordinary memory and says so: the line
 * "runner: io memory rpcmem|ordinary" names which memory the run used.
 * --share_memory_arenas is Module's share_memory_arenas (one set of planned arenas for all methods), which
 * programs exported with share_mutable_buffers rely on.
 * ETDump (--etdump_path, the QNN profile): the Module gets executorch's ETDumpGen as its event
 * tracer; every Method::execute is an event block of its own, and the QNN backend logs its profile events
 * (per op, when the program was lowered with a profile_level) into the block of the execute that made them.
 * The ETDump is written once, after the last step; harness/runner/profile.py reads it with the devtools
 * Inspector. Built only where the executorch under test ships libexecutorch_etdump.so and its header
 * (harness/runner/build.py defines SUITE_RUNNER_ETDUMP); elsewhere --etdump_path stops with exit 11. The timed
 * executes of a profiled run carry the tracer's cost, so the suite profiles in a run of its own.
 * Reference program (--reference_model_path, the performance gate's drift meter): another program (the
 * health check's one-op program, lowered for the same SoC) in a Module of its own, its first method loaded and
 * executed three times untimed before the first step (warm-up), then once after each step, timed. The case's
 * time over the reference's, both measured in this one process seconds apart, cancels what slows both (the
 * host's load, the simulator's speed of the hour): docs/PERFORMANCE.md. Its own Module, arenas and QNN
 * context: it cannot reach the case's state, and its outputs are never written. Its inputs are zeros.
 */
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/backend/options.h>
#include <executorch/runtime/platform/runtime.h>
#if defined(SUITE_RUNNER_ETDUMP)
#include <executorch/devtools/etdump/etdump_flatcc.h>
#endif

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
void* QnnExecuTorchAllocCustomMem(size_t bytes, size_t alignment);
void QnnExecuTorchFreeCustomMem(void* buffer_ptr);
}

namespace {

using executorch::extension::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::MethodMeta;
using executorch::runtime::Tag;

constexpr int kUsage = 2, kBadPlan = 3, kBadProgram = 4, kUnknownMethod = 5, kBadInputFile = 6,
              kInputMismatch = 7, kLoadFailed = 8, kExecuteFailed = 9, kOutputFailed = 10, kBadOption = 11;
constexpr const char* kPlanHeader = "qnnsuite-plan 1";
constexpr size_t kSharedAlignment = 64;
constexpr int kReferenceWarmUps = 3;  // the reference program's untimed executes before the first step

[[noreturn]] void fail(int code, const std::string& message) {
  std::fflush(stdout);
  std::cerr << "suite_runner: error: " << message << std::endl;
  std::exit(code);
}

struct Options {
  std::string model, plan, output, etdump;
  int log_level = -1, performance_mode = -1;
  bool share_memory_arenas = false, shared_buffer = false;
  std::string reference;  // --reference_model_path
};

int parse_int(const std::string& flag, const std::string& text, int low, int high) {
  char* end = nullptr;
  long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < low || value > high) {
    fail(kUsage, flag + " takes an integer from " + std::to_string(low) + " to " + std::to_string(high) +
                     ", not '" + text + "'");
  }
  return static_cast<int>(value);
}

Options parse_args(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(kUsage, flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--model_path") options.model = value();
    else if (flag == "--plan_path") options.plan = value();
    else if (flag == "--output_folder_path") options.output = value();
    else if (flag == "--log_level") options.log_level = parse_int(flag, value(), 0, 5);
    else if (flag == "--performance_mode") options.performance_mode = parse_int(flag, value(), 0, 8);
    else if (flag == "--share_memory_arenas") options.share_memory_arenas = true;
    else if (flag == "--shared_buffer") options.shared_buffer = true;
    else if (flag == "--etdump_path") options.etdump = value();
    else if (flag == "--reference_model_path") options.reference = value();
    else fail(kUsage, "unknown argument '" + flag + "': see the usage in suite_runner.cpp's header");
  }
  if (options.model.empty() || options.plan.empty() || options.output.empty()) {
    fail(kUsage, "--model_path, --plan_path and --output_folder_path are required");
  }
#if !defined(SUITE_RUNNER_ETDUMP)
  if (!options.etdump.empty()) {
    fail(kBadOption, "--etdump_path: this runner was built without executorch's ETDump (the executorch under test "
                     "ships no libexecutorch_etdump.so): run without a profile, or build executorch with "
                     "EXECUTORCH_BUILD_DEVTOOLS=ON");
  }
#endif
  return options;
}

struct Step {
  std::string method;
  std::vector<std::string> inputs;
  bool reload = false;  // a `reload` line came before it
};

std::vector<Step> read_plan(const std::string& path) {
  std::ifstream file(path);
  if (!file) fail(kBadPlan, "cannot read the plan file " + path + ": check the path");
  size_t slash = path.rfind('/');
  std::string folder = slash == std::string::npos ? "." : slash == 0 ? "" : path.substr(0, slash);
  std::vector<Step> steps;
  bool header = false, reload = false;
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    std::istringstream words(line);
    std::string first;
    if (!(words >> first) || first[0] == '#') continue;
    std::string where = path + " line " + std::to_string(number) + ": ";
    if (!header) {
      std::string version;
      words >> version;
      if (first + " " + version != kPlanHeader || (words >> version)) {
        fail(kBadPlan, where + "expected the header '" + kPlanHeader + "' (see suite_runner.cpp's header)");
      }
      header = true;
      continue;
    }
    if (first == "reload" && !(words >> first)) {
      reload = true;
      continue;
    }
    if (first != "step") fail(kBadPlan, where + "expected 'step METHOD [INPUT_FILE ...]' or 'reload', not '" + first + "'");
    Step step;
    step.reload = reload;
    reload = false;
    if (!(words >> step.method)) fail(kBadPlan, where + "a step needs a method name");
    for (std::string name; words >> name;) step.inputs.push_back(name[0] == '/' ? name : folder + "/" + name);
    steps.push_back(step);
  }
  if (!header) fail(kBadPlan, path + " is empty: a plan starts with '" + kPlanHeader + "'");
  if (steps.empty()) fail(kBadPlan, path + " has no step: add 'step METHOD [INPUT_FILE ...]' lines");
  if (reload) fail(kBadPlan, path + " ends with 'reload': a reload comes before the step it is for");
  return steps;
}

long file_size(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  return file ? static_cast<long>(file.tellg()) : -1;
}

// A step's "@N" becomes the program's Nth method name (program order, Program::get_method_name, as upstream's
// --method_index counts: Module::method_names is unordered).
void resolve_method_indices(Module& module, std::vector<Step>& steps) {
  for (size_t index = 0; index < steps.size(); ++index) {
    Step& step = steps[index];
    if (step.method.empty() || step.method[0] != '@') continue;
    std::string digits = step.method.substr(1);
    char* end = nullptr;
    long method_index = std::strtol(digits.c_str(), &end, 10);
    size_t count = module.program()->num_methods();
    // Checked here: executorch logs an index beyond the program as an error line of its own.
    bool valid = !digits.empty() && *end == '\0' && method_index >= 0 && static_cast<size_t>(method_index) < count;
    auto name = valid ? module.program()->get_method_name(static_cast<size_t>(method_index))
                      : executorch::runtime::Result<const char*>(Error::InvalidArgument);
    if (!name.ok()) {
      fail(kUnknownMethod, "step " + std::to_string(index) + ": " + step.method + " names no method of the program (it has " +
                               std::to_string(count) + "): fix the plan");
    }
    step.method = *name;
  }
}

// Every step checked against the program's methods and input metas, before any method is loaded.
void check_plan(Module& module, const std::vector<Step>& steps) {
  auto names = module.method_names();
  if (!names.ok()) fail(kBadProgram, "cannot read the methods of the program: is it a .pte of this executorch?");
  for (size_t index = 0; index < steps.size(); ++index) {
    const Step& step = steps[index];
    std::string where = "step " + std::to_string(index) + " (method " + step.method + "): ";
    if (!names->count(step.method)) {
      std::string known;
      for (const auto& name : *names) known += (known.empty() ? "" : ", ") + name;
      fail(kUnknownMethod, where + "the program has no such method (it has: " + known + "): fix the plan");
    }
    MethodMeta meta = module.method_meta(step.method).get();
    if (step.inputs.size() != meta.num_inputs()) {
      fail(kInputMismatch, where + std::to_string(step.inputs.size()) + " input file(s) given, the method takes " +
                               std::to_string(meta.num_inputs()) + ": fix the plan");
    }
    for (size_t input = 0; input < step.inputs.size(); ++input) {
      long size = file_size(step.inputs[input]);
      if (size < 0) fail(kBadInputFile, where + "cannot read input file " + step.inputs[input] + ": check the path");
      auto tag = meta.input_tag(input);
      if (!tag.ok() || *tag != Tag::Tensor) {
        fail(kInputMismatch,
             where + "input " + std::to_string(input) + " is not a tensor: this runner feeds tensors only");
      }
      size_t expected = meta.input_tensor_meta(input)->nbytes();
      if (static_cast<size_t>(size) != expected) {
        fail(kInputMismatch, where + "input file " + step.inputs[input] + " has " + std::to_string(size) +
                                 " bytes, input " + std::to_string(input) + " takes " + std::to_string(expected) +
                                 ": write the tensor's raw bytes in the method's dtype and shape");
      }
    }
  }
}

void set_backend_options(const Options& options) {
  if (options.log_level < 0 && options.performance_mode < 0) return;
  executorch::runtime::BackendOptions<2> backend_options;
  if (options.log_level >= 0) backend_options.set_option("qnn_runtime_log_level", options.log_level);
  if (options.performance_mode >= 0) {
    backend_options.set_option("qnn_runtime_htp_performance_mode", options.performance_mode);
  }
  if (executorch::runtime::set_option("QnnBackend", backend_options.view()) != Error::Ok) {
    fail(kBadOption, "the QNN backend rejected --log_level/--performance_mode: is QnnBackend linked in?");
  }
}

// Where --shared_buffer can use the QNN shared allocator: where executorch's backend loads rpcmem (see the header).
#if defined(__ANDROID__)
constexpr bool kHasRpcmem = true;
#else
constexpr bool kHasRpcmem = false;
#endif

// A tensor of info's shape and dtype in memory it keeps alive: the QNN shared allocator's when `shared`.
executorch::extension::TensorPtr allocate_tensor(const executorch::runtime::TensorInfo& info, bool shared,
                                                 const std::string& what) {
  size_t bytes = info.nbytes();
  void* data = shared ? QnnExecuTorchAllocCustomMem(bytes, kSharedAlignment) : std::malloc(bytes ? bytes : 1);
  if (data == nullptr) {
    if (shared) fail(kBadOption, "--shared_buffer: QnnExecuTorchAllocCustomMem could not allocate " + what +
                                     " (no rpcmem on this device?): run without --shared_buffer");
    fail(kBadInputFile, "out of memory allocating " + what);
  }
  std::vector<executorch::aten::SizesType> sizes(info.sizes().begin(), info.sizes().end());
  std::vector<executorch::aten::DimOrderType> dim_order(info.dim_order().begin(), info.dim_order().end());
  std::function<void(void*)> deleter = QnnExecuTorchFreeCustomMem;
  if (!shared) deleter = std::free;
  return executorch::extension::make_tensor_ptr(std::move(sizes), data, std::move(dim_order), {}, info.scalar_type(),
                                                executorch::aten::Device(executorch::aten::DeviceType::CPU),
                                                executorch::aten::TensorShapeDynamism::STATIC, deleter);
}

// An input's bytes, in memory the tensor keeps alive.
executorch::extension::TensorPtr read_input(const std::string& path, const executorch::runtime::TensorInfo& info,
                                            bool shared) {
  executorch::extension::TensorPtr tensor = allocate_tensor(info, shared, "input " + path);
  std::ifstream file(path, std::ios::binary);
  if (!file.read(static_cast<char*>(tensor->mutable_data_ptr()), static_cast<std::streamsize>(info.nbytes()))) {
    fail(kBadInputFile, "cannot read " + std::to_string(info.nbytes()) + " bytes from " + path + ": check the file");
  }
  return tensor;
}

// Memory for each output the program left unplanned (a shared-buffer program's), given to the method before
// its execute: without it QNN fails the execute with "clientBuf is null" (measured with executorch 1.5.1).
std::vector<executorch::extension::TensorPtr> supply_outputs(Module& module, const std::string& method,
                                                             const MethodMeta& meta, bool shared) {
  std::vector<executorch::extension::TensorPtr> supplied;
  for (size_t output = 0; output < meta.num_outputs(); ++output) {
    auto tag = meta.output_tag(output);
    if (!tag.ok() || tag.get() != Tag::Tensor) continue;
    auto info = meta.output_tensor_meta(output);
    if (!info.ok() || info->is_memory_planned()) continue;
    supplied.push_back(allocate_tensor(info.get(), shared, "output " + std::to_string(output) + " of " + method));
    if (module.set_output(method, EValue(*supplied.back()), output) != Error::Ok) {
      fail(kExecuteFailed, "method " + method + " refused memory for its unplanned output " + std::to_string(output));
    }
  }
  return supplied;
}

void write_output(const std::string& path, const EValue& value) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (value.isTensor()) {
    const auto& tensor = value.toTensor();
    file.write(static_cast<const char*>(tensor.const_data_ptr()), static_cast<std::streamsize>(tensor.nbytes()));
  } else if (value.isInt()) {
    int64_t number = value.toInt();
    file.write(reinterpret_cast<const char*>(&number), sizeof(number));
  } else if (value.isDouble()) {
    double number = value.toDouble();
    file.write(reinterpret_cast<const char*>(&number), sizeof(number));
  } else if (value.isBool()) {
    char flag = value.toBool() ? 1 : 0;
    file.write(&flag, 1);
  } else {
    fail(kOutputFailed, path + ": output of a type this runner cannot write (not a tensor, int, double or bool)");
  }
  if (!file) fail(kOutputFailed, "cannot write " + path + ": check that the output folder exists and is writable");
}

// See the header: the byte every probe allocation holds, -1 when they are not all MALLOC_PERTURB_'s fill.
int heap_pattern() {
  const char* requested = std::getenv("MALLOC_PERTURB_");
  if (requested == nullptr || *requested == '\0') return -1;
  char* end = nullptr;
  long value = std::strtol(requested, &end, 10);
  if (*end != '\0' || value <= 0 || value >= 256) return -1;
  const int fill = static_cast<int>(value) ^ 0xff;
  for (size_t size : {size_t{64}, size_t{4096}, size_t{1} << 20}) {
    // volatile: the bytes of a fresh allocation are read as they are, not assumed by the optimiser
    volatile unsigned char* bytes = static_cast<volatile unsigned char*>(std::malloc(size));
    if (bytes == nullptr) return -1;
    bool same = true;
    for (size_t index = 0; index < size && same; ++index) same = bytes[index] == fill;
    std::free(const_cast<unsigned char*>(bytes));
    if (!same) return -1;
  }
  return fill;
}

std::unique_ptr<executorch::runtime::EventTracer> event_tracer(const Options& options) {
#if defined(SUITE_RUNNER_ETDUMP)
  if (!options.etdump.empty()) return std::make_unique<executorch::etdump::ETDumpGen>();
#endif
  (void)options;
  return nullptr;
}

// The ETDump of the whole plan, written once after the last step (see the header).
void write_etdump(const Options& options, Module& module) {
#if defined(SUITE_RUNNER_ETDUMP)
  if (options.etdump.empty()) return;
  auto* generator = static_cast<executorch::etdump::ETDumpGen*>(module.event_tracer());
  executorch::etdump::ETDumpResult result = generator->get_etdump_data();
  if (result.buf == nullptr || result.size == 0) fail(kOutputFailed, "the event tracer recorded no ETDump");
  std::ofstream file(options.etdump, std::ios::binary | std::ios::trunc);
  file.write(static_cast<const char*>(result.buf), static_cast<std::streamsize>(result.size));
  std::free(result.buf);
  if (!file) fail(kOutputFailed, "cannot write the ETDump to " + options.etdump + ": check that its folder is writable");
  std::cout << "runner: etdump_bytes " << result.size << std::endl;
#else
  (void)options;
  (void)module;
#endif
}

long long micros_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
}

// The reference program (see the header): a Module of its own, its first method with zero inputs.
struct Reference {
  std::unique_ptr<Module> module;
  std::string method;
  std::vector<executorch::extension::TensorPtr> tensors;
  std::vector<EValue> inputs;

  long long execute() {
    auto start = std::chrono::steady_clock::now();
    auto outputs = module->execute(method, inputs);
    long long elapsed = micros_since(start);
    if (!outputs.ok()) fail(kExecuteFailed, "the reference program failed to execute (its backend's log is above)");
    return elapsed;
  }
};

std::unique_ptr<Reference> load_reference(const std::string& path) {
  if (path.empty()) return nullptr;
  auto start = std::chrono::steady_clock::now();
  auto reference = std::make_unique<Reference>();
  reference->module = std::make_unique<Module>(path, Module::LoadMode::File);
  auto name = reference->module->load() == Error::Ok ? reference->module->program()->get_method_name(0)
                                                     : executorch::runtime::Result<const char*>(Error::InvalidProgram);
  if (!name.ok()) fail(kBadProgram, "cannot load the reference program " + path + ": is it a .pte?");
  reference->method = *name;
  if (reference->module->load_method(reference->method) != Error::Ok) {
    fail(kLoadFailed, "loading the reference program's method " + reference->method + " failed: check its SoC");
  }
  MethodMeta meta = reference->module->method_meta(reference->method).get();
  for (size_t input = 0; input < meta.num_inputs(); ++input) {
    auto tag = meta.input_tag(input);
    if (!tag.ok() || *tag != Tag::Tensor) fail(kInputMismatch, "the reference program takes a non-tensor input");
    reference->tensors.push_back(allocate_tensor(meta.input_tensor_meta(input).get(), false, "a reference input"));
    std::memset(reference->tensors.back()->mutable_data_ptr(), 0, reference->tensors.back()->nbytes());
    reference->inputs.emplace_back(reference->tensors.back());
  }
  // Untimed: on the HTP simulator a graph's first executes take 10-60 ms and later ones 0.2-0.4 ms
  // (docs/PERFORMANCE.md, warm-up on the simulator)
  for (int warm_up = 0; warm_up < kReferenceWarmUps; ++warm_up) reference->execute();
  std::cout << "runner: reference load_us " << micros_since(start) << std::endl;
  return reference;
}

}  // namespace

int main(int argc, char** argv) {
  // First, before any library logs: a line of its own that nothing else writes into.
  int pattern = heap_pattern();
  char pattern_text[8] = "none";
  if (pattern >= 0) std::snprintf(pattern_text, sizeof(pattern_text), "0x%02x", pattern);
  std::cout << "runner: heap pattern " << pattern_text << std::endl;
  Options options = parse_args(argc, argv);
  executorch::runtime::runtime_init();
  std::vector<Step> steps = read_plan(options.plan);
  if (file_size(options.model) < 0) fail(kBadProgram, "cannot read the program " + options.model + ": check the path");
  if (file_size(options.output) < 0) {
    fail(kOutputFailed, "the output folder " + options.output + " does not exist: create it first");
  }

  // In an optional so that a `reload` line puts a fresh Module where this one was (`module` names either).
  std::optional<Module> program;
  auto open_program = [&]() {
    program.emplace(options.model, Module::LoadMode::File, event_tracer(options), nullptr, nullptr,
                    options.share_memory_arenas);
  };
  open_program();
  Module& module = *program;
  if (module.load() != Error::Ok) fail(kBadProgram, "cannot load the program " + options.model + ": is it a .pte?");
  resolve_method_indices(module, steps);
  check_plan(module, steps);
  set_backend_options(options);
  const bool use_rpcmem = options.shared_buffer && kHasRpcmem;
  std::cout << "runner: io memory " << (use_rpcmem ? "rpcmem" : "ordinary") << std::endl;

  std::unique_ptr<Reference> reference = load_reference(options.reference);

  std::set<std::string> loaded;
  for (const Step& step : steps) {
    if (!loaded.insert(step.method).second) continue;
    auto start = std::chrono::steady_clock::now();
    if (module.load_method(step.method) != Error::Ok) {
      fail(kLoadFailed, "loading method " + step.method + " failed (its backend's log is above): check the QNN "
                        "libraries and the program's SoC");
    }
    std::cout << "runner: load method " << step.method << " load_us " << micros_since(start) << std::endl;
  }

  for (size_t index = 0; index < steps.size(); ++index) {
    const Step& step = steps[index];
    if (step.reload) {  // every method loaded again before the next step, as at the start
      open_program();
      bool loaded_all = module.load() == Error::Ok;
      for (const std::string& method : loaded) loaded_all = loaded_all && module.load_method(method) == Error::Ok;
      if (!loaded_all) {
        fail(kLoadFailed, "reloading the program before step " + std::to_string(index) + " failed (its log is above)");
      }
      std::cout << "runner: reload before step " << index << std::endl;
    }
    MethodMeta meta = module.method_meta(step.method).get();
    std::vector<executorch::extension::TensorPtr> tensors;
    std::vector<EValue> inputs;
    for (size_t input = 0; input < step.inputs.size(); ++input) {
      tensors.push_back(read_input(step.inputs[input], meta.input_tensor_meta(input).get(), use_rpcmem));
      inputs.emplace_back(tensors.back());
    }
    auto supplied = supply_outputs(module, step.method, meta, use_rpcmem);
    auto start = std::chrono::steady_clock::now();
    auto outputs = module.execute(step.method, inputs);
    long long elapsed = micros_since(start);
    if (!outputs.ok()) {
      fail(kExecuteFailed, "step " + std::to_string(index) + " (method " + step.method + ") failed to execute (error " +
                               std::to_string(static_cast<int>(outputs.error())) + "; its backend's log is above)");
    }
    struct rusage after_step {};
    getrusage(RUSAGE_SELF, &after_step);
    std::cout << "step " << index << " method " << step.method << " execute_us " << elapsed << " peak_rss_kb "
              << after_step.ru_maxrss << std::endl;
    // Written before the next step: with shared arenas the next execute may reuse this step's output memory.
    for (size_t output = 0; output < outputs->size(); ++output) {
      write_output(options.output + "/output_" + std::to_string(index) + "_" + std::to_string(output) + ".raw",
                   (*outputs)[output]);
    }
    if (reference) {
      std::cout << "runner: reference after step " << index << " execute_us " << reference->execute() << std::endl;
    }
  }
  write_etdump(options, module);
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  std::cout << "runner: peak_rss_kb " << usage.ru_maxrss << std::endl;
  return 0;
}
