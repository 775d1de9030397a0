/*
 * A stand-in libQnnHtp.so that sits between ExecuTorch's QNN backend and the real HTP library.
 *
 * Why it exists:
 *   1. ABI bridge. ExecuTorch wheels are built against one QNN header set; the host libraries we can
 *      obtain are newer. In newer headers the union inside QnnHtpDevice_CustomConfig_t gained a
 *      pointer member, which moved it from byte offset 4 to 8, so the library reads the SoC model
 *      from the wrong place and device creation fails (14001). We rewrite each HTP device custom
 *      config into the new layout before forwarding. Only when QNNSUITE_BRIDGE_DEVICE_CONFIG=1.
 *   2. Evidence. Every graph execute is appended to QNNSUITE_TRACE as one JSON line: graph name and
 *      each input/output tensor's name, memory type, bound address (or memory handle) and size. The
 *      address-sharing check reads this to prove a mutable buffer's input and output share memory.
 *      Each line also carries the process's memory registrations so far ("registrations": QnnMem_register
 *      calls, handles registered and handles deregistered, counted here since the library was loaded), so
 *      that registrations per execute, and a registration leaked at every execute, can be read from it.
 *   3. A fault, for the harness's own tests only: with QNNSUITE_LEAK_REGISTRATION=1 every graph execute is
 *      preceded by one more registration that is never deregistered, as a runtime that registers a buffer
 *      per execute and forgets it would (executorch #13421). It goes to the real QnnMem_register (a 4 KB
 *      buffer of its own, ION type with the buffer's memfd); where the real library refuses it (the host
 *      simulator has no ION), the interposer keeps the handle it would have had as a registration of its
 *      own and says so in the trace ("leaked": the fault's registrations, "leaked_emulated": those kept so), so
 *      the counts are those of the broken runtime.
 *
 * Nothing in the real library is patched in place: we copy its interface table into our own and
 * replace a few entries. The structures below are our own minimal mirrors of the QNN C ABI, with
 * sizes asserted so a layout mistake fails the build instead of corrupting memory.
 *
 * Environment:
 *   QNNSUITE_REAL_QNNHTP          path of the real library (default: libQnnHtp.real.so beside this one)
 *   QNNSUITE_BRIDGE_DEVICE_CONFIG 1 to rewrite device custom configs into the newer layout
 *   QNNSUITE_TRACE                file to append execute records to (unset: no trace)
 *   QNNSUITE_LEAK_REGISTRATION    1 to leak one memory registration per graph execute (the fault above)
 * Built with -DENV_PREFIX='"OTHER_"' it reads OTHER_REAL_QNNHTP etc. instead, so that two of them can be
 * stacked without reading each other's settings (the emulated phone's own bridge in front of a pushed one).
 */
#define _GNU_SOURCE
#ifndef ENV_PREFIX
#define ENV_PREFIX "QNNSUITE_"
#endif
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef uint64_t qnn_status;
typedef void *qnn_handle;

/* --- the interface table ------------------------------------------------------------------- */
typedef struct { uint32_t major, minor, patch; } api_version;
enum { TABLE_SLOTS = 160 }; /* more than any QNN release has; unused tail stays as copied */
typedef struct {
    uint32_t backend_id;
    const char *provider_name;
    api_version core_api, backend_api;
    void *functions[TABLE_SLOTS];
} interface_table;
_Static_assert(__builtin_offsetof(interface_table, functions) == 40, "QnnInterface_t layout");

/* Positions of the functions we wrap, in QNN_INTERFACE_VER_TYPE order (stable across 2.x). */
enum { SLOT_GRAPH_CREATE = 15, SLOT_GRAPH_RETRIEVE = 20, SLOT_GRAPH_EXECUTE = 21,
       SLOT_MEM_REGISTER = 35, SLOT_MEM_DEREGISTER = 36, SLOT_DEVICE_CREATE = 40 };

typedef qnn_status (*get_providers_fn)(const interface_table ***, uint32_t *);
typedef qnn_status (*graph_create_fn)(qnn_handle, const char *, const void **, qnn_handle *);
typedef qnn_status (*graph_retrieve_fn)(qnn_handle, const char *, qnn_handle *);
typedef qnn_status (*graph_execute_fn)(qnn_handle, const void *, uint32_t, void *, uint32_t,
                                       qnn_handle, qnn_handle);
typedef qnn_status (*device_create_fn)(qnn_handle, const void **, qnn_handle *);
typedef qnn_status (*mem_register_fn)(qnn_handle, const void *, uint32_t, qnn_handle *);
typedef qnn_status (*mem_deregister_fn)(const qnn_handle *, uint32_t);

/* Qnn_MemDescriptor_t (QnnMem.h): a shape, a data type, a memory type and the ION fd (or custom info). */
typedef struct {
    struct { uint32_t rank; uint32_t *dimensions; const char *config; } shape;
    uint32_t data_type, mem_type;
    union { int32_t ion_fd; void *custom; } info;
} mem_descriptor;
_Static_assert(sizeof(mem_descriptor) == 40, "Qnn_MemDescriptor_t layout");
enum { MEM_TYPE_ION = 1, DATATYPE_UINT_8 = 0x0108, LEAK_BYTES = 4096 };

/* --- tensors (Qnn_Tensor_t with its v1/v2 union; both share the leading fields we read) -------- */
typedef struct {
    uint32_t version;
    struct { uint32_t id; } __attribute__((aligned(8))) head; /* the v1/v2 union starts at 8 */
    const char *name;
    uint32_t type, data_format, data_type;
    uint64_t quantize_params[5]; /* Qnn_QuantizeParams_t: 40 bytes, pointer-aligned */
    uint32_t rank;
    uint32_t *dimensions;
    uint32_t mem_type; /* 0 raw client buffer, 1 memory handle */
    union { struct { void *data; uint32_t size; } client; void *mem_handle; } mem;
    uint8_t v2_tail[24];
} tensor;
_Static_assert(sizeof(tensor) == 144, "Qnn_Tensor_t stride");
/* Qnn_QuantizeParams_t, read for the trace: how a quantized buffer's bytes decode (real = (q + offset) x scale),
 * so that what an uninitialised quantized buffer reads can be predicted (docs/FINDINGS.md#F1). */
typedef struct { int32_t definition; int32_t encoding; float scale; int32_t offset; } quantize_params;
enum { QUANTIZATION_SCALE_OFFSET = 0, DEFINITION_UNDEFINED = 0x7FFFFFFF };
_Static_assert(sizeof(quantize_params) <= 40, "inside Qnn_QuantizeParams_t");
_Static_assert(__builtin_offsetof(tensor, mem) == 104, "Qnn_Tensor_t data offset");

/* --- device configs ------------------------------------------------------------------------ */
typedef struct { uint32_t option; void *custom; } device_config; /* QnnDevice_Config_t */
enum { DEVICE_CONFIG_OPTION_CUSTOM = 0 };
typedef struct { uint32_t option; uint8_t payload[8]; } htp_device_custom_old; /* union at 4 */
typedef struct { uint32_t option; uint32_t pad; uint8_t payload[16]; } htp_device_custom_new; /* at 8 */
_Static_assert(__builtin_offsetof(htp_device_custom_new, payload) == 8, "new layout");

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static void *real_library;
static char load_error[512];
static interface_table **our_providers;
static uint32_t provider_count;
static void *real_functions_of[8][TABLE_SLOTS]; /* per provider: the real entries */
static int bridge_device_config;

/* graph handle -> name, for the trace */
enum { MAX_GRAPHS = 256 };
static struct { qnn_handle handle, context; char name[128]; } graphs[MAX_GRAPHS];
static int graph_count;
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long execute_seq;
/* Memory registrations since the library was loaded: QnnMem_register calls, and the handles registered and
 * deregistered by the calls that succeeded (the leak fault's own included). Under state_lock. */
static unsigned long register_calls, handles_registered, handles_deregistered;
/* The leak fault's registrations, and those of them the real library refused (kept as the interposer's own). */
static unsigned long leaks_made, leaks_emulated;
static int leak_registration;

static void remember_graph(qnn_handle handle, qnn_handle context, const char *name) {
    pthread_mutex_lock(&state_lock);
    int slot = -1;
    for (int i = 0; i < graph_count; i++) if (graphs[i].handle == handle) slot = i;
    if (slot < 0 && graph_count < MAX_GRAPHS) slot = graph_count++;
    if (slot >= 0) {
        graphs[slot].handle = handle;
        graphs[slot].context = context;
        snprintf(graphs[slot].name, sizeof graphs[slot].name, "%s", name ? name : "");
    }
    pthread_mutex_unlock(&state_lock);
}

static const char *graph_name(qnn_handle handle) {
    for (int i = 0; i < graph_count; i++) if (graphs[i].handle == handle) return graphs[i].name;
    return "";
}

static qnn_handle graph_context(qnn_handle handle) {
    qnn_handle context = NULL;
    pthread_mutex_lock(&state_lock);
    for (int i = 0; i < graph_count; i++) if (graphs[i].handle == handle) context = graphs[i].context;
    pthread_mutex_unlock(&state_lock);
    return context;
}

static void json_string(FILE *out, const char *text) {
    fputc('"', out);
    for (const unsigned char *c = (const unsigned char *)(text ? text : ""); *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(out, "\\%c", *c);
        else if (*c < 0x20) fprintf(out, "\\u%04x", *c);
        else fputc(*c, out);
    }
    fputc('"', out);
}

static void trace_tensors(FILE *out, const tensor *tensors, uint32_t count) {
    fputc('[', out);
    for (uint32_t i = 0; i < count; i++) {
        const tensor *t = &tensors[i];
        if (i) fputc(',', out);
        fputs("{\"name\":", out);
        json_string(out, t->name);
        fprintf(out, ",\"data_type\":%" PRIu32, t->data_type);
        const quantize_params *q = (const quantize_params *)t->quantize_params;
        if (q->encoding == QUANTIZATION_SCALE_OFFSET && q->definition != DEFINITION_UNDEFINED)
            fprintf(out, ",\"scale\":%.9g,\"offset\":%" PRId32, (double)q->scale, q->offset);
        if (t->mem_type == 1)
            fprintf(out, ",\"mem\":\"handle\",\"handle\":\"%p\"}", t->mem.mem_handle);
        else
            fprintf(out, ",\"mem\":\"raw\",\"addr\":\"%p\",\"bytes\":%" PRIu32 "}",
                    t->mem.client.data, t->mem.client.size);
    }
    fputc(']', out);
}

static void write_trace(qnn_handle graph, const tensor *inputs, uint32_t n_in,
                        const tensor *outputs, uint32_t n_out, qnn_status status) {
    const char *path = getenv(ENV_PREFIX "TRACE");
    if (!path || !*path) return;
    pthread_mutex_lock(&state_lock);
    FILE *out = fopen(path, "a");
    if (out) {
        fprintf(out, "{\"event\":\"execute\",\"pid\":%d,\"seq\":%lu,\"graph\":", (int)getpid(),
                execute_seq++);
        json_string(out, graph_name(graph));
        fputs(",\"inputs\":", out);
        trace_tensors(out, inputs, n_in);
        fputs(",\"outputs\":", out);
        trace_tensors(out, outputs, n_out);
        fprintf(out, ",\"registrations\":{\"register_calls\":%lu,\"registered\":%lu,\"deregistered\":%lu",
                register_calls, handles_registered, handles_deregistered);
        if (leak_registration) fprintf(out, ",\"leaked\":%lu,\"leaked_emulated\":%lu", leaks_made, leaks_emulated);
        fprintf(out, "},\"status\":%" PRIu64 "}\n", status);
        fclose(out);
    }
    pthread_mutex_unlock(&state_lock);
}

/* The wrapped calls find the real function through the provider the handle came from; all
 * providers of one library share implementations, so provider 0's entry is the right one. */
#define REAL(slot, type) ((type)real_functions_of[0][slot])

static qnn_status wrapped_graph_create(qnn_handle context, const char *name, const void **config,
                                       qnn_handle *graph) {
    qnn_status status = REAL(SLOT_GRAPH_CREATE, graph_create_fn)(context, name, config, graph);
    if (status == 0 && graph) remember_graph(*graph, context, name);
    return status;
}

static qnn_status wrapped_graph_retrieve(qnn_handle context, const char *name, qnn_handle *graph) {
    qnn_status status = REAL(SLOT_GRAPH_RETRIEVE, graph_retrieve_fn)(context, name, graph);
    if (status == 0 && graph) remember_graph(*graph, context, name);
    return status;
}

static qnn_status wrapped_mem_register(qnn_handle context, const void *descriptors, uint32_t count,
                                       qnn_handle *handles) {
    qnn_status status = REAL(SLOT_MEM_REGISTER, mem_register_fn)(context, descriptors, count, handles);
    pthread_mutex_lock(&state_lock);
    register_calls++;
    if (status == 0) handles_registered += count;
    pthread_mutex_unlock(&state_lock);
    return status;
}

static qnn_status wrapped_mem_deregister(const qnn_handle *handles, uint32_t count) {
    qnn_status status = REAL(SLOT_MEM_DEREGISTER, mem_deregister_fn)(handles, count);
    pthread_mutex_lock(&state_lock);
    if (status == 0) handles_deregistered += count;
    pthread_mutex_unlock(&state_lock);
    return status;
}

/* The fault: one registration of a fresh 4 KB buffer in the graph's context, never deregistered (see the
 * header). The buffer is a memfd mapped for as long as the process lives, as a leaked one would be. Once the
 * real library refused one (the simulator logs "QnnMem API is not supported" each time), the later ones are
 * kept as the interposer's own without asking it again. */
static void leak_one_registration(qnn_handle graph) {
    static int refused;
    qnn_status status = 1;
    int forwarded = 0;
    if (!refused) {
        int fd = memfd_create("qnnsuite-leak", MFD_CLOEXEC);
        void *data = fd >= 0 && ftruncate(fd, LEAK_BYTES) == 0
                         ? mmap(NULL, LEAK_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
        uint32_t dimensions[1] = {LEAK_BYTES};
        mem_descriptor descriptor = {{1, dimensions, NULL}, DATATYPE_UINT_8, MEM_TYPE_ION, {.ion_fd = fd}};
        qnn_handle handle = NULL;
        if (data != MAP_FAILED) {
            status = wrapped_mem_register(graph_context(graph), &descriptor, 1, &handle);
            forwarded = 1;
        }
        refused = status != 0;
    }
    pthread_mutex_lock(&state_lock);
    leaks_made++;
    if (status != 0) { /* refused (no ION here): kept as the interposer's own registration, a call of its own */
        register_calls += !forwarded;
        handles_registered++;
        leaks_emulated++;
    }
    pthread_mutex_unlock(&state_lock);
}

static qnn_status wrapped_graph_execute(qnn_handle graph, const void *inputs, uint32_t n_in,
                                        void *outputs, uint32_t n_out, qnn_handle profile,
                                        qnn_handle signal) {
    if (leak_registration) leak_one_registration(graph);
    qnn_status status = REAL(SLOT_GRAPH_EXECUTE, graph_execute_fn)(graph, inputs, n_in, outputs,
                                                                    n_out, profile, signal);
    write_trace(graph, inputs, n_in, outputs, n_out, status);
    return status;
}

static qnn_status wrapped_device_create(qnn_handle logger, const void **configs,
                                        qnn_handle *device) {
    device_create_fn real = REAL(SLOT_DEVICE_CREATE, device_create_fn);
    if (!bridge_device_config || !configs) return real(logger, configs, device);
    size_t n = 0;
    while (configs[n]) n++;
    device_config *rewritten = calloc(n, sizeof *rewritten);
    htp_device_custom_new *customs = calloc(n, sizeof *customs);
    const void **list = calloc(n + 1, sizeof *list);
    if (!rewritten || !customs || !list) {
        free(rewritten); free(customs); free(list);
        return real(logger, configs, device);
    }
    for (size_t i = 0; i < n; i++) {
        rewritten[i] = *(const device_config *)configs[i];
        if (rewritten[i].option == DEVICE_CONFIG_OPTION_CUSTOM && rewritten[i].custom) {
            const htp_device_custom_old *old = rewritten[i].custom;
            customs[i].option = old->option;
            memcpy(customs[i].payload, old->payload, sizeof old->payload);
            rewritten[i].custom = &customs[i];
        }
        list[i] = &rewritten[i];
    }
    qnn_status status = real(logger, list, device);
    free(rewritten); free(customs); free(list);
    return status;
}

static void load_real_library(void) {
    const char *path = getenv(ENV_PREFIX "REAL_QNNHTP");
    char sibling[4096];
    if (!path || !*path) {
        Dl_info self;
        if (!dladdr((void *)&load_real_library, &self) || !self.dli_fname) {
            snprintf(load_error, sizeof load_error, "cannot locate the interposer itself");
            return;
        }
        snprintf(sibling, sizeof sibling, "%s", self.dli_fname);
        char *slash = strrchr(sibling, '/');
        snprintf(slash ? slash + 1 : sibling, sizeof sibling - (slash ? (size_t)(slash + 1 - sibling) : 0),
                 "libQnnHtp.real.so");
        path = sibling;
    }
    real_library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!real_library) {
        snprintf(load_error, sizeof load_error, "%s", dlerror());
        return;
    }
    get_providers_fn real_get = (get_providers_fn)dlsym(real_library, "QnnInterface_getProviders");
    const interface_table **real_list = NULL;
    uint32_t count = 0;
    if (!real_get || real_get(&real_list, &count) != 0 || count == 0) {
        snprintf(load_error, sizeof load_error, "%.400s has no usable QnnInterface_getProviders", path);
        return;
    }
    if (count > 8) count = 8;
    our_providers = calloc(count, sizeof *our_providers);
    for (uint32_t i = 0; i < count; i++) {
        interface_table *copy = malloc(sizeof *copy);
        memcpy(copy, real_list[i], sizeof *copy);
        memcpy(real_functions_of[i], copy->functions, sizeof copy->functions);
        copy->functions[SLOT_GRAPH_CREATE] = (void *)wrapped_graph_create;
        copy->functions[SLOT_GRAPH_RETRIEVE] = (void *)wrapped_graph_retrieve;
        copy->functions[SLOT_GRAPH_EXECUTE] = (void *)wrapped_graph_execute;
        copy->functions[SLOT_DEVICE_CREATE] = (void *)wrapped_device_create;
        if (copy->functions[SLOT_MEM_REGISTER]) copy->functions[SLOT_MEM_REGISTER] = (void *)wrapped_mem_register;
        if (copy->functions[SLOT_MEM_DEREGISTER])
            copy->functions[SLOT_MEM_DEREGISTER] = (void *)wrapped_mem_deregister;
        our_providers[i] = copy;
    }
    const char *bridge = getenv(ENV_PREFIX "BRIDGE_DEVICE_CONFIG");
    bridge_device_config = bridge && strcmp(bridge, "1") == 0;
    const char *leak = getenv(ENV_PREFIX "LEAK_REGISTRATION");
    leak_registration = leak && strcmp(leak, "1") == 0;
    provider_count = count;
}

__attribute__((visibility("default")))
qnn_status QnnInterface_getProviders(const interface_table ***providers, uint32_t *count) {
    pthread_once(&load_once, load_real_library);
    if (!our_providers) {
        fprintf(stderr, "[qnnsuite interposer] cannot load the real libQnnHtp.so: %s\n", load_error);
        return 1;
    }
    *providers = (const interface_table **)our_providers;
    *count = provider_count;
    return 0;
}
