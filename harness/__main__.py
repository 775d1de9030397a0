"""`python -m harness setup|doctor|matrix|bisect|repro|emulate`: prepare the host toolchain, report on it, compare
versions, rerun one case, or serve emulated devices.

setup  lays out the QNN tree, builds the interposer and probes the bridge (all cached; fast when done).
doctor prints versions, SDK, the current interposer overlay and the `export` lines a bundle's repro.py needs,
       bridge, adb and devices; exits non-zero with one line per missing piece.
matrix runs one suite selection per executorch x onnxruntime-qnn release (harness/matrix/cli.py).
bisect finds the first release (or wheel) where a selection's verdicts change (harness/matrix/bisect.py).
repro  runs one case of an earlier run again through the suite (harness/repro/rerun.py).
emulate serves emulated devices (or phones) on an adb server until Ctrl-C (harness/emulator/serve.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from harness.device import discovery
from harness.emulator import serve
from harness.qnn.sdk import OVERLAY_MARKER, SdkError
from harness.qnn.toolchain import Toolchain, ToolchainError, prepare
from harness.repro import exports, rerun
from harness.versions import package_version

DEFAULT_EMULATED_SOCS = ("SM8650", "SM8750")


def setup(args: argparse.Namespace) -> int:
    try:
        toolchain = prepare(args.qnn_sdk)
    except (SdkError, ToolchainError) as error:
        print(f"setup: {error}", file=sys.stderr)
        return 1
    bridge = "on" if toolchain.probe.bridge_device_config else "off"
    compose = "on" if toolchain.probe.bridge_compose_graphs else "off"
    print(
        f"setup: QNN {toolchain.probe.build_id} from {toolchain.sdk.origin}, device-config bridge {bridge}, "
        f"composeGraphs bridge {compose}"
    )
    return 0


def doctor(args: argparse.Namespace) -> int:
    problems: list[str] = []
    print(f"python      {sys.version.split()[0]} ({sys.executable})")
    for package in ("torch", "torchao", "executorch", "onnxruntime-qnn", "adbutils", "pytest", "pytest-xdist"):
        version = package_version(package)
        print(f"{package:<11} {version}")
        if version == "not installed" and package in ("torch", "executorch", "adbutils"):
            problems.append(f"{package} is not installed: run the README's set-up command")
    try:
        toolchain = prepare(args.qnn_sdk)
        probe = toolchain.probe
        print(f"qnn sdk     {toolchain.sdk.root} (from {toolchain.sdk.origin})")
        print(
            f"qnn build   {probe.build_id}; QNN API {probe.library_api or '?'}, executorch tested against {probe.built_for_api or '?'}"
        )
        print(
            f"bridge      {'on' if probe.bridge_device_config else 'off'} (without: {probe.without_bridge}; with: {probe.with_bridge or '-'})"
        )
        print(
            f"compose     {'on' if probe.bridge_compose_graphs else 'off'} (composeGraphs bridge, docs/FINDINGS.md#F19: {probe.compose_probe or '-'})"
        )
        print(f"interposer  {toolchain.interposer}")
        _overlays(toolchain)
    except (SdkError, ToolchainError) as error:
        problems.append(str(error))
    try:
        import adbutils

        adb = adbutils.adb_path()
        version = subprocess.run([adb, "version"], capture_output=True, text=True, timeout=10).stdout.splitlines()
        print(f"adb         {adb} ({version[0] if version else 'unknown version'})")
        server = discovery.default_server()
        if discovery.server_listening(server.port, server.host):
            devices = adbutils.AdbClient(host=server.host, port=server.port, socket_timeout=10).list()  # bounded
            listed = ", ".join(f"{d.serial} ({d.state})" for d in devices) or "none"
            print(f"adb server  {server.address}; attached devices: {listed}")
        else:
            print(f"adb server  none on {server.address} (not started by doctor); attached devices: none seen")
    except Exception as error:  # any adb trouble is a problem to report, not a crash
        problems.append(f"adb unusable ({error}): reinstall adbutils, or set ADBUTILS_ADB_PATH to an adb binary")
    print(f"emulated    {', '.join(DEFAULT_EMULATED_SOCS)} (default when no --device is given)")
    for problem in problems:
        print(f"doctor: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _overlays(toolchain: Toolchain) -> None:
    """The overlay this checkout uses now (the SDK root repro.py needs), the lines that give a bundle's repro.py
    this toolchain, and which other overlay folders are left from another SDK or interposer (each folder is
    named by a hash of its SDK and interposer paths; its marker file names the SDK)."""
    current = toolchain.overlay_root
    print(f"overlay     {current} (current: SDK {toolchain.sdk.root}, interposer in front of libQnnHtp.so)")
    for other in sorted(path for path in current.parent.iterdir() if path.is_dir() and path != current):
        marker = other / OVERLAY_MARKER
        of = marker.read_text(errors="replace").strip() if marker.is_file() else "unknown SDK"
        print(f"            {other.name}: not current (overlay of {of!r}); unused by this checkout, safe to delete")
    print("repro.py    a bundle's repro.py runs with this toolchain after:")
    for line in exports.lines(toolchain):
        print(f"              {line}")


def _repro(args: argparse.Namespace) -> int:
    """`repro`, reading the run's report.json files as data from elsewhere (harness/report/intake.py)."""
    from harness.report.intake import read_report

    return rerun.main(args, read_report)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["matrix"]:  # its own options, and pytest's after `--`
        from harness.matrix import cli

        return cli.main(argv[1:])
    if argv[:1] == ["bisect"]:  # the matrix's environments, searched for the first release that changed
        from harness.matrix import bisect

        return bisect.main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m harness", epilog="python -m harness matrix --help (or bisect --help): their own options"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    # Listed here so --help names them; main() hands them their arguments before this parser runs.
    commands.add_parser("matrix", help="run one selection in every executorch x onnxruntime-qnn combination")
    commands.add_parser("bisect", help="find the first executorch release where a selection's verdicts change")
    for name, function, words in (
        ("setup", setup, "lay out the QNN tree, build the interposer, probe the bridge"),
        ("doctor", doctor, "print versions, SDK, bridge, adb and devices"),
    ):
        command = commands.add_parser(name, help=words)
        command.add_argument(
            "--qnn-sdk", default=None, help="QNN SDK root (else QNN_SDK_ROOT, else the onnxruntime-qnn wheel)"
        )
        command.set_defaults(function=function)
    repro = commands.add_parser("repro", help="run one case of an earlier run again, writing its reproduction bundle")
    rerun.add_arguments(repro)
    repro.set_defaults(function=_repro)
    emulate = commands.add_parser("emulate", help="serve emulated devices on an adb server until Ctrl-C")
    serve.add_arguments(emulate)
    emulate.set_defaults(function=serve.main)
    argv = sys.argv[1:] if argv is None else list(argv)
    # What follows `--` goes to pytest (repro only); argparse's subcommands cannot hold it themselves.
    passthrough = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if passthrough and args.command != "repro":
        parser.error(f"{args.command} takes no arguments after --")
    args.pytest_args = passthrough
    return args.function(args)


if __name__ == "__main__":
    sys.exit(main())
