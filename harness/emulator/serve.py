"""`python -m harness emulate`: emulated devices on an adb server until Ctrl-C, so the exact command a phone
user runs (`pytest suites --device S ...`) can run against them from another terminal.

    python -m harness emulate --soc SM8650 [--soc SM8750 ...] [--as-phone] [--adb-port PORT]
                              [--write-sdk DIR] [--write-build DIR]

The server is the user's (port 5037, or ANDROID_ADB_SERVER_PORT, or --adb-port; started if none answers),
and the devices trust only its keys (harness/emulator/launcher.py). `--as-phone` makes them look like phones
(harness/emulator/phone.py), so the harness takes its phone path for them. `--write-sdk` and
`--write-build` write a phone-layout QNN SDK tree and a standard executorch build folder for them; with no
--soc the command writes those and ends.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
from pathlib import Path

from harness.device import discovery, kinds
from harness.device.device import DeviceError
from harness.emulator import phone
from harness.emulator.launcher import EmulatorFleet, FleetError
from harness.qnn import soc as soc_table
from harness.qnn.interposer import InterposerBuildError
from harness.qnn.sdk import SdkError
from harness.qnn.toolchain import ToolchainError, prepare

READY_LINE = "emulate: serving; Ctrl-C stops"  # tests wait for this line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--soc", action="append", default=[], metavar="SOC", help="one device of this SoC (repeatable)")
    parser.add_argument("--as-phone", action="store_true", help="devices that look like phones (arm64-v8a, pushed libraries)")
    parser.add_argument("--adb-port", type=int, default=None, metavar="PORT",
                        help="the adb server's port (default ANDROID_ADB_SERVER_PORT, else 5037)")
    parser.add_argument("--write-sdk", type=Path, default=None, metavar="DIR", help="write a phone-layout QNN SDK tree here")
    parser.add_argument("--write-build", type=Path, default=None, metavar="DIR",
                        help="write a standard executorch build folder here (its runner runs on an emulated phone)")
    parser.add_argument("--qnn-sdk", default=None, help="host QNN SDK (else QNN_SDK_ROOT, else the onnxruntime-qnn wheel)")


def main(args: argparse.Namespace) -> int:
    try:
        socs = [soc_table.lookup(value).name for raw in args.soc for value in raw.split(",") if value.strip()]
    except soc_table.UnknownSocError as error:
        print(f"emulate: --soc: {error}", file=sys.stderr)
        return 2
    if not socs and not (args.write_sdk or args.write_build):
        print("emulate: nothing to do: pass --soc SOC (repeatable), or --write-sdk/--write-build DIR", file=sys.stderr)
        return 2
    try:
        toolchain = prepare(args.qnn_sdk)
        written = _write_trees(args, toolchain)
    except (SdkError, ToolchainError, OSError) as error:
        print(f"emulate: {error}", file=sys.stderr)
        return 1
    if not socs:
        return 0
    try:
        port = args.adb_port or discovery.default_server().port  # served on this host's loopback in any case
    except DeviceError as error:
        print(f"emulate: {error}", file=sys.stderr)
        return 2
    try:  # as the run's own emulated devices get it (harness/providers.py), or a phone's
        device_env = (phone.device_environment(toolchain, dict(os.environ)) if args.as_phone
                      else kinds.EmulatedKind.heap_environment(toolchain.child_env()))
    except InterposerBuildError as error:
        print(f"emulate: {error}", file=sys.stderr)
        return 1
    device_env["QNNSUITE_PYTHON"] = sys.executable
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Ctrl-C stops it even when started in the background of a script, where SIGINT arrives ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="qnnsuite-emulate-") as workdir:  # 0700, removed at the end
        try:
            with EmulatorFleet(socs, Path(workdir), device_env, as_phone=args.as_phone, user_server_port=port) as fleet:
                _announce(fleet, port, written)
                try:
                    signal.pause()
                except KeyboardInterrupt:
                    pass
        except FleetError as error:
            print(f"emulate: {error}", file=sys.stderr)
            return 1
    print("emulate: stopped", flush=True)
    return 0


def _write_trees(args: argparse.Namespace, toolchain) -> dict[str, Path]:
    written = {}
    if args.write_sdk:
        written["--qnn-sdk"] = phone.write_sdk(args.write_sdk.resolve(), toolchain.sdk)
    if args.write_build:
        written["--runner"] = phone.write_build(args.write_build.resolve())
    for option, path in written.items():
        print(f"emulate: wrote {path} (for {option})", flush=True)
    return written


def _announce(fleet: EmulatorFleet, port: int, written: dict[str, Path]) -> None:
    """Each serial on a line of its own, then the command to run from another terminal."""
    for info in fleet.devices:
        print(f"emulate: {info.serial} {info.soc}{' (as a phone)' if fleet.as_phone else ''}", flush=True)
    command = ["pytest", "suites", *[word for info in fleet.devices for word in ("--device", info.serial)]]
    command += [word for option, path in written.items() for word in (option, str(path))]
    prefix = f"ANDROID_ADB_SERVER_PORT={port} " if port != 5037 else ""
    print(f"emulate: try `{prefix}{shlex.join(command)}`", flush=True)
    print(READY_LINE, flush=True)
