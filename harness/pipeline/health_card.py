"""The health check's program: one elementwise op, no buffer, so it tests the device and nothing else.

A device must run this before it gets cases (harness/health.py). It holds no mutable buffer, so
no executorch defect under test (docs/FINDINGS.md) can make a healthy device fail it; it goes through
the same export, lowering, artifact cache and device run as every case. Tagged so the check matrices
(harness/pipeline/cases.py) leave it out of the suite's cases and reports.
"""

from __future__ import annotations

import torch

from harness.pipeline.card import ModelCard, register
from harness.pipeline.cases import HEALTH_CHECK_TAG
from harness.vocabulary import FLOAT_DTYPE, Case, Mode

STEPS = 2  # two lines of the input list: the runner must also get past its first execute
WIDTH = 8


class OneOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _steps(count: int) -> list[tuple[torch.Tensor, ...]]:
    return [(torch.arange(WIDTH, dtype=torch.float32).reshape(1, WIDTH) + step,) for step in range(count)]


HEALTH_CARD = register(
    ModelCard(
        name="qnnsuite_health_one_op",
        build=OneOp,
        steps=_steps,
        mutated_buffers=(),
        tags=frozenset({HEALTH_CHECK_TAG}),
        module=__name__,
        dtypes=(FLOAT_DTYPE,),
    )
)


def health_case(soc: str) -> Case:
    """The health check's case for a SoC; also the performance gate's reference program (harness/case_store.py),
    lowered once per SoC through the same cache key."""
    return Case(HEALTH_CARD, FLOAT_DTYPE, Mode.DELEGATE, soc)
