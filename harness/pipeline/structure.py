"""A lowering's structural performance facts, taken in the lowering child: what makes a program slower on a
phone is mostly decided here, and all of it is exact on the host (docs/PERFORMANCE.md#structural-facts-and-the-structural-gate).

Per method of the program:
- each QNN graph (a delegate): the QNN ops executorch hands the QNN library, counted by QNN op type (the op
  wrappers' own GetOpType, recorded while QnnBackend builds them), its context binary's size (the delegate's
  processed bytes) and the bytes that cross the delegate boundary per execute (its tensor inputs and the
  outputs its method reads: a buffer kept inside the delegate does not cross);
- the ops outside any delegate, counted by op (they run on the CPU);
- the planned memory: the ExecutionPlan's arena sizes (non_const_buffer_sizes, arena 0 is reserved).

The QNN op types are read by wrapping QnnBackend's two preprocess entry points for the lowering's duration
(OpTypeRecorder, from start() to stop()): a lowered module keeps only the context binary, which names no op.
A delegate's ops are matched to it by its processed bytes (single-method preprocess), else by method and
partition order (the multi-method preprocess, whose methods may share one context binary).
"""

from __future__ import annotations

import collections
import hashlib
from typing import Any

DELEGATE_CALL = "executorch_call_delegate"


class OpTypeRecorder:
    """QNN op types per preprocessed graph, recorded while QnnBackend preprocesses (see the module's docstring)."""

    def __init__(self) -> None:
        self.by_binary: dict[str, dict[str, int]] = {}  # sha256 of processed bytes -> op type counts
        self.by_method: dict[str, list[dict[str, int]]] = {}  # method -> op type counts per partition
        self._calls: list[dict[str, int]] = []
        self._originals: dict[str, Any] = {}

    def ops_of(self, method: str, index: int, processed: bytes) -> dict[str, int] | None:
        """The QNN op types of a method's index-th delegate, whose processed bytes are `processed`."""
        per_method = self.by_method.get(method, [])
        if index < len(per_method):
            return per_method[index]
        return self.by_binary.get(hashlib.sha256(processed).hexdigest())

    def start(self) -> None:
        """Record from now on (QnnBackend's entry points wrapped in this process) until stop()."""
        from executorch.backends.qualcomm.qnn_preprocess import QnnBackend

        self._originals = {
            name: QnnBackend.__dict__[name] for name in ("_build_op_wrappers", "preprocess", "preprocess_multimethod")
        }
        build, single, multi = (original.__func__ for original in self._originals.values())

        def build_op_wrappers(*args: Any, **kwargs: Any):
            wrappers = build(*args, **kwargs)
            if isinstance(wrappers, list):  # bytes: a context binary loaded as it is, no op of its own
                counts: collections.Counter[str] = collections.Counter(
                    str(wrapper.GetOpWrapper().GetOpType()) for wrapper in wrappers
                )
                self._calls.append(dict(sorted(counts.items())))
            return wrappers

        def preprocess(*args: Any, **kwargs: Any):
            self._calls.clear()
            result = single(*args, **kwargs)
            if len(self._calls) == 1:
                self.by_binary[hashlib.sha256(bytes(result.processed_bytes)).hexdigest()] = self._calls[0]
            return result

        def preprocess_multimethod(edge_programs: dict, *args: Any, **kwargs: Any):
            self._calls.clear()
            results = multi(edge_programs, *args, **kwargs)
            methods = list(edge_programs)
            if len(self._calls) == sum(len(programs) for programs in edge_programs.values()):
                for position, counts in enumerate(self._calls):  # partition i of method j: call i x methods + j
                    self.by_method.setdefault(methods[position % len(methods)], []).append(counts)
            return results

        replaced = {
            "_build_op_wrappers": build_op_wrappers,
            "preprocess": preprocess,
            "preprocess_multimethod": preprocess_multimethod,
        }
        for name, function in replaced.items():
            setattr(QnnBackend, name, staticmethod(function))

    def stop(self) -> None:
        """QnnBackend as it was (nothing to do when start() was never called)."""
        if self._originals:
            from executorch.backends.qualcomm.qnn_preprocess import QnnBackend

            for name, original in self._originals.items():
                setattr(QnnBackend, name, original)
            self._originals = {}


def _nbytes(value: Any) -> int:
    """Bytes of a node's value (a tensor, or a tuple or list of them: a delegate's outputs)."""
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(item) for item in value)
    numel, itemsize = getattr(value, "numel", None), getattr(getattr(value, "dtype", None), "itemsize", None)
    return int(numel()) * int(itemsize) if callable(numel) and itemsize else 0


def _boundary_bytes(call: Any) -> int:
    """Bytes a delegate call takes from and gives to its method per execute: its tensor arguments and the
    outputs the method reads (a mutable buffer's new value that stays in the delegate is read by nothing)."""
    taken = sum(_nbytes(arg.meta.get("val")) for arg in call.args[1:] if hasattr(arg, "meta"))
    readers = [user for user in call.users if "getitem" in str(user.target)]
    given = sum(_nbytes(user.meta.get("val")) for user in readers) if readers else _nbytes(call.meta.get("val"))
    return taken + given


def _op_name(target: Any) -> str:
    return str(getattr(target, "__name__", target))


def method_structure(program: Any, method: str, recorder: OpTypeRecorder) -> dict[str, Any]:
    """One method's graphs (delegates, in graph order) and the ops outside them, counted by op."""
    graph_module = program.graph_module
    calls = [node for node in graph_module.graph.nodes if node.op == "call_function"]
    delegates = [node for node in calls if DELEGATE_CALL in str(node.target)]
    graphs = {}
    for index, node in enumerate(delegates):
        lowered = getattr(graph_module, str(node.args[0].target))
        processed = bytes(lowered.processed_bytes)
        ops = recorder.ops_of(method, index, processed)
        name = method if len(delegates) == 1 else f"{method}[{index}]"
        graphs[name] = {
            "qnn_ops": ops,  # None: not recorded (a delegate this suite's recorder did not see preprocessed)
            "context_binary_bytes": len(processed),
            "boundary_bytes": _boundary_bytes(node),
        }
    outside = collections.Counter(
        _op_name(node.target) for node in calls if node not in delegates and "getitem" not in str(node.target)
    )
    return {"graphs": graphs, "ops_outside": dict(sorted(outside.items()))}


def planned_memory(executorch_program: Any) -> dict[str, list[int]]:
    """Per method, the ExecutionPlan's planned arena sizes in bytes (arena 0, reserved, left out)."""
    return {
        str(plan.name): [int(size) for size in (plan.non_const_buffer_sizes or [])[1:]]
        for plan in executorch_program.execution_plan
    }


def graphs_of(edge_manager: Any, methods: tuple[str, ...], recorder: OpTypeRecorder) -> dict[str, Any]:
    """Each method's graphs and ops outside them ({"methods": ...}), read from the lowered edge program before it
    is serialized (to_executorch rewrites its graph in place: out variants, allocations); {"error": why} when
    they could not be read: a measurement beside the case, never its lowering's failure."""
    try:
        return {
            "methods": {
                method: method_structure(edge_manager.exported_program(method), method, recorder) for method in methods
            }
        }
    except Exception as error:  # executorch's program objects differ between releases
        return _unreadable(error)


def structure_of(graphs: dict[str, Any], executorch_manager: Any) -> dict[str, Any]:
    """The program's structural facts, {"methods": {method: {graphs, ops_outside, planned_arena_bytes}}}: graphs
    (graphs_of) with each method's planned arenas from the serialized program; {"error": why} as graphs_of."""
    if "methods" not in graphs:
        return graphs
    try:
        planned = planned_memory(executorch_manager.executorch_program)
    except Exception as error:
        return _unreadable(error)
    return {
        "methods": {
            method: {**facts, "planned_arena_bytes": planned.get(method, [])}
            for method, facts in graphs["methods"].items()
        }
    }


def _unreadable(error: Exception) -> dict[str, str]:
    return {"error": f"{type(error).__name__}: {str(error).strip()[:200]}"}
