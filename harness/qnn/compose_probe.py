"""Child process that loads and runs an online-prepared one-op program (docs/FINDINGS.md#F19).

Run by harness.qnn.toolchain with and without the system bridge (system_bridge.c): whether it crashes at load
without it and runs correctly with it decides if the bridge goes on. A child, because the defect kills the
process that loads the program. Lowers `x + 1` for SM8650 fp16 with online_prepare=True in a private folder
(QNN's IR backend writes `forward.dlc` into the working directory), runs it on ones and prints one JSON
line: {"ok": bool, "value": float | null, "error": str}.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

PREFIX = "QNNSUITE_COMPOSE_PROBE "
TOLERANCE = 1e-3  # fp16 on the HTP simulator: 1 + 1 comes back as 2.0000002


def main() -> int:
    result: dict = {"ok": False, "value": None, "error": ""}
    try:
        import torch
        from executorch.backends.qualcomm.utils.utils import (
            generate_htp_compiler_spec,
            generate_qnn_executorch_compiler_spec,
            get_soc_to_chipset_map,
            to_edge_transform_and_lower_to_qnn,
        )
        from executorch.runtime import Runtime

        class AddOne(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x + 1

        specs = generate_qnn_executorch_compiler_spec(
            soc_model=get_soc_to_chipset_map()["SM8650"],
            backend_options=generate_htp_compiler_spec(use_fp16=True),
            online_prepare=True,
        )
        with tempfile.TemporaryDirectory(prefix="qnnsuite-compose-probe-") as folder:
            os.chdir(folder)
            program = to_edge_transform_and_lower_to_qnn(AddOne().eval(), (torch.ones(1, 4),), specs).to_executorch()
            path = os.path.join(folder, "probe.pte")
            with open(path, "wb") as file:
                file.write(program.buffer)
            print("loading", flush=True)  # what a crash at load leaves as the last line
            method = Runtime.get().load_program(path).load_method("forward")
            result["value"] = float(method.execute([torch.ones(1, 4)])[0].max())
            os.chdir("/")
        result["ok"] = abs(result["value"] - 2.0) <= TOLERANCE
    except Exception as error:  # reported to the parent, which words the failure
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    print(PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
