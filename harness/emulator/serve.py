"""`python -m harness emulate`: emulated devices on an adb server until Ctrl-C, so the exact command a phone
user runs (`pytest suites --device S ...`) can run against them from another terminal.

    python -m harness emulate --soc SM8650 [--soc SM8750 ...] [--as-phone]
                              [--adb-port PORT --allow-tcp-server [--allow-network-server]]
                              [--write-sdk DIR] [--write-build DIR]

By default the devices are served by an adb server of emulate's own, on a unix socket in a private folder
(an adb server authenticates no client: on a TCP port, any local account would get root shells on the
devices); emulate prints the `export ADB_SERVER_SOCKET=localfilesystem:...` line that points adb and the
suite at it. With --adb-port the server is the user's TCP one there (started on loopback if none answers),
and the devices trust only its keys (harness/emulator/launcher.py); since any local account may talk to a
TCP adb server, loopback included, and get the devices' root shells through it, --adb-port is refused unless
--allow-tcp-server says that is meant; a server that listens beyond loopback (`adb -a`) would hand them to
every host on the network, so it is refused unless --allow-network-server says that too. `--as-phone` makes them look like phones
(harness/emulator/phone.py), so the harness takes its phone path for them. `--write-sdk` and
`--write-build` write a phone-layout QNN SDK tree and a standard executorch build folder for them; with no
--soc the command writes those and ends.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path

from harness.device import kinds
from harness.device.adb import AdbServer
from harness.emulator import phone
from harness.emulator.launcher import EmulatorFleet, FleetError
from harness.files import NoWorkFolder, make_work_folder
from harness.qnn import soc as soc_table
from harness.qnn.interposer import InterposerBuildError
from harness.qnn.sdk import SdkError
from harness.qnn.toolchain import ToolchainError, prepare

READY_LINE = "emulate: serving; Ctrl-C stops"  # tests wait for this line
REFUSED = "refused"  # _user_server said why it will not serve on the user's TCP server


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--soc", action="append", default=[], metavar="SOC", help="one device of this SoC (repeatable)")
    parser.add_argument(
        "--as-phone", action="store_true", help="devices that look like phones (arm64-v8a, pushed libraries)"
    )
    parser.add_argument(
        "--adb-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve on your TCP adb server at this port (default: a private server on a unix socket)",
    )
    parser.add_argument(
        "--allow-tcp-server",
        action="store_true",
        help="accept --adb-port: every local account can use a TCP adb server, loopback included, and gets "
        "root shells on the emulated devices through it",
    )
    parser.add_argument(
        "--allow-network-server",
        action="store_true",
        help="accept an --adb-port server that listens beyond loopback (`adb -a`): every host that "
        "reaches it gets root shells on the emulated devices",
    )
    parser.add_argument(
        "--write-sdk",
        type=Path,
        default=None,
        metavar="DIR",
        help="write a phone-layout QNN SDK tree into this new (or empty, yours) folder",
    )
    parser.add_argument(
        "--write-build",
        type=Path,
        default=None,
        metavar="DIR",
        help="write a standard executorch build folder into this new (or empty, yours) folder "
        "(its runner runs on an emulated phone)",
    )
    parser.add_argument(
        "--qnn-sdk", default=None, help="host QNN SDK (else QNN_SDK_ROOT, else the onnxruntime-qnn wheel)"
    )


def main(args: argparse.Namespace) -> int:
    try:
        socs = [soc_table.lookup(value).name for raw in args.soc for value in raw.split(",") if value.strip()]
    except soc_table.UnknownSocError as error:
        print(f"emulate: --soc: {error}", file=sys.stderr)
        return 2
    if not socs and not (args.write_sdk or args.write_build):
        print("emulate: nothing to do: pass --soc SOC (repeatable), or --write-sdk/--write-build DIR", file=sys.stderr)
        return 2
    user_server = _user_server(args) if socs else None
    if user_server is REFUSED:
        return 2
    try:
        toolchain = prepare(args.qnn_sdk)
        written = _write_trees(args, toolchain)
    except (SdkError, ToolchainError, OSError) as error:
        print(f"emulate: {error}", file=sys.stderr)
        return 1
    if not socs:
        return 0
    try:  # as the run's own emulated devices get it (harness/providers.py), or a phone's
        device_env = (
            phone.device_environment(toolchain, dict(os.environ))
            if args.as_phone
            else kinds.EmulatedKind.heap_environment(toolchain.child_env())
        )
    except InterposerBuildError as error:
        print(f"emulate: {error}", file=sys.stderr)
        return 1
    device_env["QNNSUITE_PYTHON"] = sys.executable
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Ctrl-C stops it even when started in the background of a script, where SIGINT arrives ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:  # 0700, removed at the end; never silently elsewhere when $TMPDIR or /tmp is full
        workdir = make_work_folder("qnnsuite-emulate-")
    except NoWorkFolder as error:
        print(f"emulate: {error}", file=sys.stderr)
        return 1
    try:
        with EmulatorFleet(socs, workdir, device_env, as_phone=args.as_phone, user_server=user_server) as fleet:
            _announce(fleet, written)
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
    except FleetError as error:
        print(f"emulate: {error}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("emulate: stopped", flush=True)
    return 0


def _user_server(args: argparse.Namespace) -> AdbServer | str | None:
    """The user's TCP adb server that --adb-port names (None without it), or REFUSED after one line saying why."""
    if args.adb_port is None:
        return None
    if not 0 < args.adb_port < 65536:
        print(
            f"emulate: --adb-port {args.adb_port}: give a TCP port (1-65535), or drop it for a private server",
            file=sys.stderr,
        )
        return REFUSED
    if not args.allow_tcp_server:
        print(
            f"emulate: --adb-port {args.adb_port}: any local account can use a TCP adb server, loopback "
            f"included, and would get root shells on the emulated devices; drop --adb-port for a private "
            f"server, or pass --allow-tcp-server if that is meant",
            file=sys.stderr,
        )
        return REFUSED
    user_server = AdbServer("127.0.0.1", args.adb_port)  # served on this host's loopback in any case
    exposed = network_listeners(args.adb_port)
    if exposed and not args.allow_network_server:
        print(
            f"emulate: the adb server on port {args.adb_port} listens on {', '.join(exposed)}, beyond loopback "
            f"(`adb -a`): every host that reaches it would get root shells on the emulated devices; restart it "
            f"without -a, drop --adb-port for a private server, or pass --allow-network-server",
            file=sys.stderr,
        )
        return REFUSED
    return user_server


def _write_trees(args: argparse.Namespace, toolchain) -> dict[str, Path]:
    written = {}
    if args.write_sdk:
        written["--qnn-sdk"] = phone.write_sdk(args.write_sdk, toolchain.sdk)  # never resolved through links
    if args.write_build:
        written["--runner"] = phone.write_build(args.write_build)
    for option, path in written.items():
        print(f"emulate: wrote {path} (for {option})", flush=True)
    return written


def network_listeners(port: int) -> list[str]:
    """The non-loopback addresses a TCP socket listens on at `port` on this host (/proc/net/tcp and tcp6)."""
    found = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != "0A":  # TCP_LISTEN
                continue
            address_hex, _, port_hex = fields[1].partition(":")
            if int(port_hex, 16) != port:
                continue
            raw = bytes.fromhex(address_hex)  # 32-bit words in host (little-endian) order
            address = ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4)))
            mapped = getattr(address, "ipv4_mapped", None)
            if not (mapped or address).is_loopback:
                found.append(str(address))
    return sorted(set(found))


def _announce(fleet: EmulatorFleet, written: dict[str, Path]) -> None:
    """Each serial on a line of its own, the server to export, then the command to run from another terminal."""
    for info in fleet.devices:
        print(f"emulate: {info.serial} {info.soc}{' (as a phone)' if fleet.as_phone else ''}", flush=True)
    command = ["pytest", "suites", *[word for info in fleet.devices for word in ("--device", info.serial)]]
    command += [word for option, path in written.items() for word in (option, str(path))]
    ((name, value),) = fleet.server.environment.items()
    print(f"emulate: export {name}={shlex.quote(value)}", flush=True)
    print(f"emulate: try `{shlex.join(command)}` with that exported", flush=True)
    print(READY_LINE, flush=True)
