"""Reading the interposer's execute trace for delegated mutable buffers.

ExecuTorch names a delegated buffer's graph tensors `input_{id}_mutbuf_{pos}_{name}` and
`output_mutbuf_{pos}_{name}`; the runtime must bind the input and output with the same pos to one
address, which is what keeps the state inside the delegate from step to step. (The trace's memory
registration counts are read where the device layer can read them too: harness/runner/contract.py.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.runner import contract

INPUT = re.compile(r"^input_\d+_mutbuf_(\d+)_(.+?)(@\d+)?$")
OUTPUT = re.compile(r"^output_mutbuf_(\d+)_(.+?)(@\d+)?$")


@dataclass(frozen=True)
class MutbufBinding:
    """One buffer at one execute: where its input and its output were bound."""

    execute: int
    position: int
    input_name: str
    output_name: str | None
    input_address: str
    output_address: str | None

    @property
    def shared(self) -> bool:
        return self.output_address is not None and self.input_address == self.output_address


read_trace = contract.read_trace


def _where(tensor: dict) -> str:
    return tensor.get("addr") or f"handle:{tensor.get('handle')}"


def bindings(records: list[dict]) -> list[MutbufBinding]:
    """Every delegated buffer's input/output binding at every execute, in order."""
    found = []
    for execute, record in enumerate(r for r in records if r.get("event") == "execute"):
        outputs = {}
        for tensor in record["outputs"]:
            match = OUTPUT.match(tensor["name"])
            if match:
                outputs[int(match.group(1))] = tensor
        for tensor in record["inputs"]:
            match = INPUT.match(tensor["name"])
            if not match:
                continue
            position = int(match.group(1))
            output = outputs.get(position)
            found.append(
                MutbufBinding(
                    execute,
                    position,
                    tensor["name"],
                    output and output["name"],
                    _where(tensor),
                    output and _where(output),
                )
            )
    return found
