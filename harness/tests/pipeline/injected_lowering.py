"""Lowering regressions injected into a real lowering, for the structural gate's tests and bench/.

    python -m harness.tests.pipeline.injected_lowering INJECTION REQUEST [REQUEST...]

Lowers each request through harness.pipeline.lower_job in this one process (executorch imported once), with
INJECTION in force for all of them:
- clean: nothing changed (the reference, and the no-false-alarm runs);
- transpose_pair: a pass at the end of QNN's preprocess pipeline that puts two transposes, each the other's
  inverse, after the graph's first elementwise multiply: the values are unchanged, the QNN graph has two more
  Transpose ops (what a layout pass gone wrong adds);
- mul_on_cpu: the partitioner told to leave aten.mul.Tensor on the CPU (skip_node_op_set), as a partitioner
  that stops supporting an op would.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path

INJECTIONS = ("clean", "transpose_pair", "mul_on_cpu")
SKIPPED_OP = "aten.mul.Tensor"


def _insert_transpose_pair(graph_module) -> None:
    """After the first aten.mul.Tensor with a 2-D value: permute (1, 0) twice, its users reading the second."""
    from executorch.exir.dialects._ops import ops as exir_ops

    graph = graph_module.graph
    target = next(
        node
        for node in graph.nodes
        if node.op == "call_function"
        and getattr(node.target, "__name__", "") == "aten.mul.Tensor"
        and node.meta["val"].dim() == 2
    )
    users = list(target.users)
    previous = target
    for _ in range(2):
        with graph.inserting_after(previous):
            permute = graph.call_function(exir_ops.edge.aten.permute_copy.default, (previous, [1, 0]))
        permute.meta = {**{key: value for key, value in target.meta.items() if key != "val"}}
        permute.meta["val"] = previous.meta["val"].permute(1, 0)
        previous = permute
    for user in users:
        user.replace_input_with(target, previous)
    graph_module.recompile()


def inject(injection: str) -> None:
    """Put the injection in force in this process (see the module's docstring)."""
    if injection == "transpose_pair":
        from executorch.backends.qualcomm._passes.qnn_pass_manager import QnnPassManager

        original = QnnPassManager.transform_for_preprocess_pipeline

        def transformed(self, exported_program, use_mha2sha=False):
            graph_module = original(self, exported_program, use_mha2sha=use_mha2sha)
            _insert_transpose_pair(graph_module)
            return graph_module

        QnnPassManager.transform_for_preprocess_pipeline = transformed
    elif injection == "mul_on_cpu":
        from executorch.backends.qualcomm.utils import utils

        lower: Callable = utils.to_edge_transform_and_lower_to_qnn
        utils.to_edge_transform_and_lower_to_qnn = functools.partial(lower, skip_node_op_set={SKIPPED_OP})
    elif injection != "clean":
        raise SystemExit(f"unknown injection {injection!r}: one of {', '.join(INJECTIONS)}")


def main(argv: list[str]) -> int:
    from harness.pipeline import lower_job

    inject(argv[0])
    for request in argv[1:]:
        lower_job.main([request])
        print(f"lowered {Path(request).parent}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
