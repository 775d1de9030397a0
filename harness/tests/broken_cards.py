"""Cards that are wrong on purpose, so the checks can be shown to fail (harness tests only)."""

from __future__ import annotations

import errno
import os
import signal

import torch

from harness.pipeline.card import ModelCard, register


def _steps(n: int) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.rand(1, 8, generator=generator),) for _ in range(n)]


class SplitByUnsupportedOp(torch.nn.Module):
    """cumprod has no QNN lowering, so the graph splits into two delegates around it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(1, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(x)
        return torch.cumprod(self.state * 2, dim=-1) * 3


class UndeclaredBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("actual", torch.zeros(1, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.actual.add_(x)
        return self.actual * 1


def _steps_changing_shape(n: int) -> list[tuple[torch.Tensor, ...]]:
    """The first step (what export traces) is (1, 8), the later ones (1, 9): quantization's calibration
    runs the exported graph on them and fails, export does not."""
    return [(torch.ones(1, 8 if index == 0 else 9),) for index in range(n)]


class CrashesTheProcess(torch.nn.Module):
    """Kills its own process when built: to the harness, a crash in executorch's C++ looks like this."""

    def __init__(self) -> None:
        super().__init__()
        os.kill(os.getpid(), signal.SIGSEGV)


class FillsTheDisk(torch.nn.Module):
    """Fails as a full disk does when built (ENOSPC): a failure of the machine, not of the case."""

    def __init__(self) -> None:
        super().__init__()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "model.pte")


SPLIT = register(ModelCard("split_by_unsupported_op", SplitByUnsupportedOp, _steps, ("state",), module=__name__))
MISDECLARED = register(ModelCard("misdeclared_buffer", UndeclaredBuffer, _steps, ("declared",), module=__name__))
UNCALIBRATABLE = register(
    ModelCard("fails_in_calibration", UndeclaredBuffer, _steps_changing_shape, ("actual",), module=__name__)
)
CRASHING = register(ModelCard("crashes_the_process", CrashesTheProcess, _steps, ("state",), module=__name__))
DISK_FULL = register(ModelCard("fills_the_disk", FillsTheDisk, _steps, ("state",), module=__name__))
