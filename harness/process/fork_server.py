"""A fork server: heavy modules imported once, a fresh forked child per request.

The lowering of a case pays seconds of `import torch, executorch` per invocation while doing a few seconds
of work (declared in harness/process/services.py). It gets a server built from this module: it imports its modules once,
then forks a child per request that takes the client's argv, cwd, umask and stdin/stdout/stderr (received
as descriptors, SCM_RIGHTS), runs the service's entry point and _exits.
The client (harness.process.fork_client) gets the child's exit status, 128+N if signal N killed it; if the client
goes away first (`timeout -s KILL`, adb closing the stream, a pytest worker dying) the child is SIGKILLed
at once.

Every child starts from the server as it was right after its imports: no .pte and no QNN library is ever
loaded there (checked in /proc/self/maps at start), no tensor op runs there (so no torch or executorch
thread pool exists to be lost by fork), hence each request loads its own backend and nothing carries over
from one request to the next.

QNN libraries: in a child, ExecuTorch dlopens libQnnHtp.so (the interposer of the overlay) by name, and the
dynamic loader searches the LD_LIBRARY_PATH the *server* started with: it reads the variable once per
process, so a client's value could change nothing anyway (measured: a server started without the
overlay on its LD_LIBRARY_PATH fails every run with "Cannot Open QNN library libQnnHtp.so"). Hence: start the
server with the clients' environment (the toolchain's child_env puts the overlay on LD_LIBRARY_PATH). A
request whose LD_LIBRARY_PATH would find another libQnnHtp.so than the server's is turned down, and the
client runs it the slow way.

Only the run's own processes are served: a request must carry the run's secret (SOCKET.key, 0600, written
by spawn_server in the run's private work folder, read by the client beside the socket), and its peer (the
kernel's SO_PEERCRED, not what the request says) must be this user's, in the server's own pid and mount
namespaces (a jailed device command is not) and a descendant of the process that started the server. Any
other request is refused and logged. A child's environment is the server's, fixed at its start (QNN_SDK_ROOT,
LD_*, PYTHON* among it): a request's own environment is never used, so no request can point the child's
imports or libraries elsewhere.

A child declares its exit code to the server (a byte on a pipe) once its work is done and its stdio is
released, and the client gets that status at once: tearing down a process that loaded torch and the QNN
libraries takes 20-60 ms more, which the client need not wait for. A child that dies without declaring is
reported by its end, as before.

A service may also prepare each request in the server, just before its child is forked (Service.prepare):
what it loads there every later child inherits, e.g. a program that several lowerings start from, read once.
Preparing must start no thread (a forked child would lack it): a server whose preparation did turns every
later request down, and its clients run them the slow way.

The server writes its pid to SOCKET.pid and logs to SOCKET.log; on SIGTERM, or when the process that started
it dies, it kills its children, reports them to their clients as killed (137) and removes its files.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import hmac
import importlib
import json
import os
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from harness.files import write_atomically
from harness.paths import REPO_ROOT
from harness.process.fork_client import MAX_MESSAGE_BYTES, STD_FDS, key_file_of, unix_address
from harness.process.services import SERVICES, Service

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 5.0
SHUTDOWN_JOIN_S = 2.0  # under STOP_TIMEOUT_S, so stop_server need not escalate to SIGKILL
LISTEN_BACKLOG = 64
PR_SET_PDEATHSIG = 1
QNN_LIBRARY = "libQnnHtp.so"  # what ExecuTorch dlopens by name
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
PARENT_ENV = "QNNSUITE_FORK_SERVER_PARENT"  # the pid whose death stops the server
PEER_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
CHECKED_NAMESPACES = ("pid", "mnt")  # a jailed process has its own; the run's own processes share the server's

Entry = Callable[[list[str]], object]
Prepare = Callable[[list[str]], None]
EXITED = -1  # end_of: the child ended without declaring its code; its status is how it ended
THREADS_SETTLE_S = 2.0  # a Python thread starting or ending is briefly a thread Python does not list


class ForkServerError(RuntimeError):
    """A fork server did not come up; the message names its log."""


def pid_file_of(socket_path: Path) -> Path:
    return socket_path.with_name(socket_path.name + ".pid")


def log_file_of(socket_path: Path) -> Path:
    return socket_path.with_name(socket_path.name + ".log")


def write_key(socket_path: Path) -> None:
    """A fresh secret in SOCKET.key, readable by this user only, never written through a planted link."""
    key = Path(key_file_of(str(socket_path)))
    key.unlink(missing_ok=True)
    descriptor = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(secrets.token_hex(32))


def namespace_of(pid: int | str, kind: str) -> int:
    """The inode of a process's namespace of this kind (equal inodes: the same namespace)."""
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether `ancestor` is `pid` or one of its parents (read from /proc; False once the chain ends)."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as stat_file:
                pid = int(stat_file.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return pid == ancestor


def shell_status(wait_status: int) -> int:
    """A child's end as a shell reports it: its exit code, or 128+N when signal N killed it."""
    code = os.waitstatus_to_exitcode(wait_status)
    return code if code >= 0 else 128 - code


def exit_code(value: object) -> int:
    """What `sys.exit(value)` makes of a value, so a child ends with the code a fresh Python would."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def library_on_path(search_path: str, cwd: str) -> Path | None:
    """The QNN_LIBRARY that the dynamic loader would find on this LD_LIBRARY_PATH, resolved; None if none.

    An empty or relative entry is taken from `cwd`, as the loader takes it from the cwd at dlopen time.
    """
    for directory in search_path.split(os.pathsep):
        candidate = Path(cwd, directory, QNN_LIBRARY)
        if candidate.is_file():
            return candidate.resolve()
    return None


def foreign_threads() -> set[int]:
    """Threads of this process that Python did not start (a library's pool, say), by native id."""
    return {int(task) for task in os.listdir("/proc/self/task")} - {
        thread.native_id for thread in threading.enumerate()
    }


def qnn_libraries_mapped() -> list[str]:
    """libQnn* files mapped into this process: the server must have none, each child loads its own."""
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "/libQnn" in line})


def exit_if_qnn_libraries_mapped(after: str) -> None:
    """Stop the server (before it serves) when `after`, what it just did, mapped a QNN library."""
    mapped = qnn_libraries_mapped()
    if mapped:
        sys.exit(
            f"fork server: {after} mapped {', '.join(mapped)}; QNN libraries must load only in each request's child"
        )


class ForkServer:
    """Accepts requests on a Unix socket: a thread per connection, a forked child per request."""

    def __init__(
        self, socket_path: Path, entry: Entry, program: str, prepare: Prepare | None = None, *, secret: str
    ) -> None:
        """entry(argv) runs one request in the child; program becomes the child's sys.argv[0]; prepare(argv),
        if given, runs in the server before each request's child is forked (see the module's docstring);
        secret: what every request must carry."""
        self.socket_path = socket_path
        self.secret = secret
        # What every child runs with: the server's environment at its start, less the server's own settings.
        self.environment = {name: value for name, value in os.environ.items() if name != PARENT_ENV}
        parent = os.environ.get(PARENT_ENV, "")
        self.run_pid = int(parent) if parent.isdigit() else None
        self.entry = entry
        self.program = program
        self.prepare = prepare
        self.broken: str | None = None  # why every request is turned down from now on
        self.library_path = os.environ.get("LD_LIBRARY_PATH", "")
        self.libc = ctypes.CDLL(None)
        self.lock = threading.Lock()
        self.children: dict[int, int] = {}  # pid -> pidfd, until reaped
        self.stopping = False

    def serve(self) -> None:
        """Listen until SIGTERM; then kill the children and remove the socket and pid file."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.socket_path.unlink(missing_ok=True)
        address, directory = unix_address(str(self.socket_path))
        try:
            listener.bind(address)
        finally:
            if directory is not None:
                os.close(directory)
        listener.listen(LISTEN_BACKLOG)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        self.stop_with_parent()
        write_atomically(pid_file_of(self.socket_path), str(os.getpid()))
        print(f"fork server: pid {os.getpid()} serving {self.socket_path}", flush=True)
        try:
            while True:
                connection, _ = listener.accept()
                # Threads inherit this mask, so SIGTERM reaches the main thread and interrupts accept().
                unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
                try:
                    threading.Thread(target=self.handle, args=(connection,), daemon=True).start()
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        finally:
            listener.close()
            self.stop_children()
            self.socket_path.unlink(missing_ok=True)
            pid_file_of(self.socket_path).unlink(missing_ok=True)
            Path(key_file_of(str(self.socket_path))).unlink(missing_ok=True)

    def stop_with_parent(self) -> None:
        """SIGTERM this server when the process that started it dies (a SIGKILLed pytest leaves nothing)."""
        parent = os.environ.get(PARENT_ENV)
        if not parent:
            return
        self.libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != int(parent):  # it died before the line above
            sys.exit(0)

    def stop_children(self) -> None:
        """Kill every running child and give the connection threads a moment to tell their clients."""
        with self.lock:
            self.stopping = True
            for pidfd in self.children.values():
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        deadline = time.monotonic() + SHUTDOWN_JOIN_S
        for thread in threading.enumerate():
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def handle(self, connection: socket.socket) -> None:
        """One request: fork its child, then report its status or kill it when the client goes."""
        with connection:
            message, fds, _, _ = socket.recv_fds(connection, MAX_MESSAGE_BYTES, len(STD_FDS))
            try:
                if not message:
                    return
                request = json.loads(message)
                intrusion = self.intrusion(connection, request)
                if intrusion:
                    print(f"fork server: refused a request: {intrusion}", flush=True)
                    send(connection, {"refused": "not a request of this run"})
                    return
                refusal = self.refusal(request)
                started = None if refusal else self.start_child(request, fds)
            finally:
                for fd in fds:
                    os.close(fd)
            if started is None:
                send(connection, {"refused": refusal or "the server is stopping"})
                return
            pid, pidfd, declared = started
            try:
                end = self.end_of(connection, pidfd, declared) if send(connection, {"started": pid}) else None
            finally:
                os.close(declared)
            if end is None:  # the client went first
                self.reap(pid, pidfd, kill=True)
            elif end == EXITED:
                send(connection, {"status": self.reap(pid, pidfd, kill=False)})
            else:  # the client goes on while the child is torn down
                send(connection, {"status": end})
                self.reap(pid, pidfd, kill=False)

    def intrusion(self, connection: socket.socket, request: object) -> str | None:
        """Why this request is not the run's own (see the module's docstring), or None when it is."""
        pid, uid, _ = PEER_CREDENTIALS.unpack(
            connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEER_CREDENTIALS.size)
        )
        if uid != os.getuid():
            return f"its peer (pid {pid}) is uid {uid}"
        try:
            foreign = [kind for kind in CHECKED_NAMESPACES if namespace_of(pid, kind) != namespace_of("self", kind)]
        except OSError:
            return f"its peer (pid {pid}) cannot be checked"
        if foreign:
            return f"its peer (pid {pid}) is in another {' and '.join(foreign)} namespace (a jail)"
        if self.run_pid is not None and not descends_from(pid, self.run_pid):
            return f"its peer (pid {pid}) is not a process of the run (pid {self.run_pid})"
        sent = request.get("secret") if isinstance(request, dict) else None
        if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), self.secret.encode()):
            return f"its peer (pid {pid}) sent no or a wrong secret"
        return None

    def refusal(self, request: dict) -> str | None:
        """Why this request cannot run here (the client then runs it itself), or None."""
        if self.broken:
            return self.broken
        wanted = library_on_path(request["env"].get("LD_LIBRARY_PATH", ""), request["cwd"])
        loaded = library_on_path(self.library_path, request["cwd"])
        if wanted != loaded:
            return (
                f"its LD_LIBRARY_PATH finds {QNN_LIBRARY} at {wanted}, the server's at {loaded}; "
                f"start the server with the clients' environment"
            )
        return None

    def start_child(self, request: dict, fds: list[int]) -> tuple[int, int, int] | None:
        """Fork the request's child; (pid, pidfd, the pipe it declares its code on), or None once the server
        is stopping or broken."""
        server_pid = os.getpid()
        with self.lock:  # no fork while a request is prepared: a child must not inherit a half-loaded program
            if self.stopping:
                return None
            self.prepare_request(request["argv"])
            if self.broken:
                return None
            # What the server holds (its imports, a prepared program) is no child's garbage: a child's full
            # collections need not walk it, nor write to its pages (measured: lowering a program the server
            # had read took 25% longer than reading it in the child, until frozen).
            gc.freeze()
            # Pending C stdio output of the server must not be flushed a second time, by the child.
            sys.stdout.flush()
            sys.stderr.flush()
            self.libc.fflush(None)
            declared, declare = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(declared)
                self.run_child(server_pid, request, fds, declare)
            os.close(declare)
            pidfd = os.pidfd_open(pid)
            self.children[pid] = pidfd
        return pid, pidfd, declared

    def prepare_request(self, argv: list[str]) -> None:
        """The service's preparation of a request, if it has one; a failure is logged and left to the child,
        which does the work itself. One that started a thread breaks the server (see the module's docstring)."""
        if self.prepare is None:
            return
        before = foreign_threads()
        try:
            self.prepare(argv)
        except Exception:
            traceback.print_exc()
        started = foreign_threads() - before
        settled_by = time.monotonic() + THREADS_SETTLE_S
        while started and time.monotonic() < settled_by:  # a bound, not a fixed wait: a loaded host is slower
            time.sleep(0.01)
            started = foreign_threads() - before
        if started:
            self.broken = (
                f"preparing a request in the fork server started {len(started)} thread(s), which its "
                f"forked children would lack; every request now runs in a fresh process"
            )
            print(f"fork server: {self.broken}", flush=True)

    def run_child(self, server_pid: int, request: dict, fds: list[int], declare: int) -> None:
        """In the child: take on the client's process state, run the entry point, and never return."""
        code = 1
        try:
            # Tied to the forking thread, which lives until it has reaped this child.
            self.libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
            if os.getppid() != server_pid:
                os._exit(128 + signal.SIGKILL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            for target, fd in zip(request["fds"], fds):
                os.dup2(fd, target)
            for missing in set(STD_FDS) - set(request["fds"]):
                os.close(missing)
            # Everything else is the server's: its socket, other clients' connections and descriptors.
            os.closerange(len(STD_FDS), declare)
            os.closerange(declare + 1, os.sysconf("SC_OPEN_MAX"))
            os.chdir(request["cwd"])
            os.umask(request["umask"])
            os.environ.clear()
            os.environ.update(self.environment)
            sys.argv = [self.program, *request["argv"]]
            # New stream objects: the server's may hold buffered output or a lock taken by another thread.
            sys.stdin = open(0, closefd=False) if 0 in request["fds"] else None
            sys.stdout = open(1, "w", closefd=False) if 1 in request["fds"] else None
            sys.stderr = (
                open(2, "w", buffering=1, closefd=False, errors="backslashreplace") if 2 in request["fds"] else None
            )
            code = exit_code(self.entry(request["argv"]))
        except SystemExit as exit_request:
            code = exit_code(exit_request.code)
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                for stream in (sys.stdout, sys.stderr):
                    if stream is not None:
                        stream.flush()
                self.libc.fflush(None)
                # The client's descriptors are let go (an adb stream ends when its last holder closes it),
                # then the code is declared: the client need not wait for this process's teardown.
                quiet = os.open(os.devnull, os.O_RDWR)
                for fd in STD_FDS:
                    os.dup2(quiet, fd)
                os.write(declare, bytes([code & 0xFF]))
            finally:
                os._exit(code)

    def end_of(self, connection: socket.socket, pidfd: int, declared: int) -> int | None:
        """Wait for the child: the code it declared, EXITED if it ended without declaring one, or None if the
        client hung up first."""
        poller = select.poll()
        for fd in (pidfd, connection, declared):
            poller.register(fd, select.POLLIN)
        while True:
            ready = dict(poller.poll())
            if declared in ready:
                code = os.read(declared, 1)
                if code:
                    return code[0]
                poller.unregister(declared)  # closed undeclared: the child is ending, pidfd says how
            elif pidfd in ready:
                return EXITED
            else:
                return None

    def reap(self, pid: int, pidfd: int, kill: bool) -> int:
        """Reap the child (SIGKILLing it first if asked) and return its shell status."""
        with self.lock:
            del self.children[pid]
            if kill:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        _, wait_status = os.waitpid(pid, 0)
        os.close(pidfd)
        return shell_status(wait_status)


def send(connection: socket.socket, message: dict) -> bool:
    """Send one message; False when the client is gone."""
    try:
        connection.send(json.dumps(message).encode())
    except OSError:
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    """`python -m harness.process.fork_server SERVICE --socket PATH`: import the service's modules, check
    that no QNN library came with them, serve until SIGTERM."""
    parser = argparse.ArgumentParser(description="A fork server for one of the suite's services.")
    parser.add_argument("service", choices=sorted(SERVICES), help="which service (harness/process/services.py)")
    parser.add_argument("--socket", type=Path, required=True, help="Unix socket to serve on")
    args = parser.parse_args(argv)
    service = SERVICES[args.service]
    for name in service.preload:
        importlib.import_module(name)
    exit_if_qnn_libraries_mapped(f"importing {', '.join(service.preload)}")
    entry = importlib.import_module(service.entry)
    serve = entry.main
    if service.server_entry:
        serve = _named(service.server_entry)()
    prepare = _named(service.prepare) if service.prepare else None
    code = 0
    try:
        secret = Path(key_file_of(str(args.socket.absolute()))).read_text().strip()
        ForkServer(args.socket.absolute(), serve, entry.__file__, prepare, secret=secret).serve()
    except SystemExit as stop:  # SIGTERM
        code = exit_code(stop.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        # Its children, socket and pid file are gone by now; tearing down torch's interpreter state on
        # the way out took another second per server, for nothing.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _named(reference: str) -> Callable:
    """The function a "module:function" reference names."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def spawn_server(service: Service, socket_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start the service's server on socket PATH without waiting for it (see wait_until_serving); its log is PATH.log.

    env: the clients' environment (the toolchain's child_env): every request's child runs with it (a request's
    own is never used). The run's secret goes to PATH.key (write_key), where the run's clients read it."""
    socket_path = Path(socket_path).absolute()
    pid_file_of(socket_path).unlink(missing_ok=True)
    write_key(socket_path)
    python = env.get("QNNSUITE_PYTHON") or sys.executable
    with open(log_file_of(socket_path), "wb") as log:
        return subprocess.Popen(
            [python, "-m", __name__, service.name, "--socket", str(socket_path)],
            cwd=REPO_ROOT,
            env={**env, PARENT_ENV: str(os.getpid())},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_until_serving(process: subprocess.Popen[bytes], socket_path: Path, timeout_s: float = START_TIMEOUT_S) -> None:
    """Return once the server accepts requests; ForkServerError (naming its log) if it never does."""
    socket_path = Path(socket_path).absolute()
    pid_file, log = pid_file_of(socket_path), log_file_of(socket_path)
    deadline = time.monotonic() + timeout_s
    while not (pid_file.exists() and pid_file.read_text() == str(process.pid)):
        if process.poll() is not None:
            raise ForkServerError(f"fork server {socket_path.name} exited {process.returncode}; see {log}")
        if time.monotonic() > deadline:
            stop_server(process)
            raise ForkServerError(f"fork server {socket_path.name} not ready after {timeout_s:.0f} s; see {log}")
        time.sleep(0.05)


def start_server(
    service: Service, socket_path: Path, env: dict[str, str], timeout_s: float = START_TIMEOUT_S
) -> subprocess.Popen[bytes]:
    """spawn_server, then wait_until_serving."""
    process = spawn_server(service, socket_path, env)
    wait_until_serving(process, socket_path, timeout_s)
    return process


def stop_server(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server kills its children and removes its files), SIGKILL if it lingers; idempotent."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
