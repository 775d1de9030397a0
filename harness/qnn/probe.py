"""Child process that asks the ExecuTorch under test to start a QNN HTP backend and lower one op.

Run by harness.qnn.toolchain with and without the device-config bridge; whether this succeeds, and
what the QNN log says, decides if the bridge is needed. A child, because a failed backend start can
leave the process unusable and because the result must not depend on what the parent has loaded.
Prints one JSON line: {"ok": bool, "build_id": str, "error": str}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    result = {"ok": False, "build_id": "", "error": ""}
    try:
        import torch
        from executorch.backends.qualcomm.python import PyQnnManagerAdaptor
        from executorch.backends.qualcomm.utils.utils import (
            generate_htp_compiler_spec,
            generate_qnn_executorch_compiler_spec,
            get_soc_to_chipset_map,
            to_edge_transform_and_lower_to_qnn,
        )

        library = Path(os.environ["QNN_SDK_ROOT"]) / "lib" / "x86_64-linux-clang" / "libQnnHtp.so"
        result["build_id"] = PyQnnManagerAdaptor.GetQnnSdkBuildId(str(library))

        class Double(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x * 2

        specs = generate_qnn_executorch_compiler_spec(
            soc_model=get_soc_to_chipset_map()[sys.argv[1] if len(sys.argv) > 1 else "SM8650"],
            backend_options=generate_htp_compiler_spec(use_fp16=True),
        )
        to_edge_transform_and_lower_to_qnn(Double().eval(), (torch.ones(1, 4),), specs)
        result["ok"] = True
    except Exception as error:  # reported to the parent, which words the failure
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    sys.stdout.flush()
    print("QNNSUITE_PROBE " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
