"""What the cross-version step asks inside one release's venv (harness/matrix/cross.py runs it there):

    <release venv>/bin/python -m harness.matrix.cross_runtime --cache-dir DIR --out FILE CASE_ID...

Writes FILE (JSON): the environment that release's processes run QNN with (its interposer overlay, the
bridge its own probe decided: `Toolchain.child_env`), and per case id the lowering its suite would serve
from its artifact cache. A cache entry is taken only when its folder's name is the content key this
release's harness computes for it now (`harness/pipeline/cache.py`: the card's sources, the executorch,
torch and torchao builds, the QNN build, ...), so a stale entry of an older harness or another build is
never mistaken for this release's program. Everything here runs in the release's venv because the key
and the probe depend on its executorch.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from harness.files import write_atomically
from harness.pipeline import card as cards
from harness.pipeline.facts import FactsError, LoweringRequest
from harness.pipeline.lowering_cache import lowering_directory, served
from harness.qnn.sdk import SdkError
from harness.qnn.toolchain import Toolchain, ToolchainError, prepare
from harness.repro.exports import EXPORTED
from harness.vocabulary import Case

REQUEST_FILE = "request.json"


def lowering(case_id: str, cache_dir: Path, toolchain: Toolchain) -> dict:
    """The case's lowering in this release's cache: {"program", "method_index", "card", "steps"} or
    {"missing": why}."""
    candidates = sorted(path for path in cache_dir.glob(f"{case_id}-*") if (path / REQUEST_FILE).is_file())
    why = f"no lowering of {case_id} in {cache_dir}: run the matrix's suite selection for this release first"
    with tempfile.TemporaryDirectory() as unused_work:
        for directory in candidates:
            try:
                request = LoweringRequest.read(directory / REQUEST_FILE)
                case = Case(cards.find(request.card), request.dtype, request.mode, request.soc)
            except (FactsError, OSError, ValueError, KeyError, TypeError) as error:
                why = f"{directory.name}: unreadable request ({type(error).__name__}: {error})"
                continue
            if case.id != case_id:
                continue
            if lowering_directory(case, request.steps, toolchain, cache_dir, Path(unused_work)) != directory:
                continue  # another harness's or another build's entry: not this release's program
            artifact = served(case, directory)
            if artifact is None:
                return {"missing": f"{directory.name}: damaged or unfinished lowering"}
            if artifact.facts.error is not None:
                error = artifact.facts.error
                return {"missing": f"lowering failed: {error.type}: {error.message}"}
            return {
                "program": str(directory / "model.pte"),
                "method_index": artifact.facts.method_index,
                "card": request.card,
                "steps": request.steps,
            }
    return {"missing": why}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.matrix.cross_runtime", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cache-dir", type=Path, required=True, help="this release's artifact cache")
    parser.add_argument("--out", type=Path, required=True, help="where the JSON answer goes")
    parser.add_argument("case_ids", nargs="*")
    args = parser.parse_args(argv)
    try:
        toolchain = prepare()
    except (SdkError, ToolchainError) as error:
        print(f"cross_runtime: {error}", file=sys.stderr)
        return 1
    env = toolchain.child_env(base={})
    answer = {
        "env": {name: env[name] for name in EXPORTED},
        "qnn_build_id": toolchain.probe.build_id,
        "lowerings": {case_id: lowering(case_id, args.cache_dir, toolchain) for case_id in args.case_ids},
    }
    write_atomically(args.out, json.dumps(answer, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
