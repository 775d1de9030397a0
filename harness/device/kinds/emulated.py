"""The emulated device: the suite's own (harness/emulator/), running host binaries and the HTP simulator.

Its runner's heap is set to a known byte, so a buffer the delegate never initialises (docs/FINDINGS.md#F1)
reads the same value on every run and the known defect has an exact signature.
"""

from __future__ import annotations

import functools
from importlib import metadata
from pathlib import Path

from harness.device.kinds.base import PayloadInputs
from harness.device.payload import PayloadFile, emulated_payload
from harness.qnn.sdk import QnnSdk
from harness.runner import build as runner_build, contract as runner_contract

HOST_ABI = "x86_64"  # an attached device that runs host binaries is emulated: real phones are arm64
# The byte every fresh heap allocation of an emulated device's runner holds: a delegated buffer that is
# never initialised (docs/FINDINGS.md#F1) then reads the same value on every run, 0x40404040 = 3.0039 as
# float32, so the known defect has an exact signature. Non-zero, finite in every float width, and far
# from the cards' registered values.
EMULATED_HEAP_PATTERN = 0x40


class EmulatedKind:
    name = "emulated"
    label = "simulator"
    emulated = True
    # The interposer wraps the host QNN library, so every graph execute is traced with its tensors' addresses.
    has_execute_trace = True
    heap_pattern: int | None = EMULATED_HEAP_PATTERN
    suite_runner_hint = ""  # its payload has the suite's runner whenever the host can build it

    def payload(self, abi: str, htp_arch: int, given: PayloadInputs) -> list[PayloadFile]:
        return emulated_payload(abi, given.runner, emulated_suite_runner()[0])

    @staticmethod
    def host_libraries(sdk: QnnSdk) -> dict[str, Path]:
        """What the device's runner uses without its being pushed (its provenance): the host executorch's QNN
        backend library and the host SDK's libQnnHtp.so, by role ("backend") or file name."""
        backend = Path(
            str(metadata.distribution("executorch").locate_file("executorch/lib/libexecutorch_backend_qnn.so"))
        )
        return {"backend": backend, "libQnnHtp.so": sdk.htp_library}

    @staticmethod
    def heap_environment(env: dict[str, str]) -> dict[str, str]:
        """env plus what makes every heap allocation start as heap_pattern, and huge pages for large blocks (the
        device commands' environment: every runner starts with it; the one body is the runner contract's)."""
        return runner_contract.heap_environment(env, EMULATED_HEAP_PATTERN)


@functools.cache
def emulated_suite_runner() -> tuple[Path | None, str]:
    """The suite's runner built for the host, which emulated devices run programs with, or None and the one
    line that says why it cannot be built (they then run them through the pybindings qnn_executor_runner).
    Built once (cached by content: harness/runner/build.py), so every worker after the controller finds it."""
    try:
        return runner_build.build(), ""
    except runner_build.RunnerBuildError as error:
        return None, str(error)
