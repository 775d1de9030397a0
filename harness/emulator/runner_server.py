"""A runner server per emulated device: torch and executorch imported once, a fresh forked child per run.

    python -m harness.emulator.runner_server --socket PATH

Why: a fresh `python -m harness.emulator.host_runner` spends 4-5 s importing torch and executorch before it
runs anything. The server imports them once; each connection from runner_client.py forks a child that takes
the client's argv, cwd, umask, environment (os.environ replaced) and stdin/stdout/stderr (received as
descriptors), runs host_runner.main and _exits. Every child starts from the server as it was right after
its imports: no .pte and no QNN library is ever loaded there (checked in /proc/self/maps at start), no
tensor op runs there (so no torch or executorch thread pool exists to be lost by fork), hence each run
loads its own backend and nothing carries over from run to run. The client gets the child's exit status,
128+N if signal N killed it; if the client goes away first (`timeout -s KILL`, adb closing the stream) the
child is SIGKILLed at once.

QNN libraries: in a child, ExecuTorch dlopens libQnnHtp.so (the interposer of the overlay) by name, and the
dynamic loader searches the LD_LIBRARY_PATH the *server* started with: it reads the variable once per
process, so the client's value, now in os.environ, changes nothing (measured: a server started without the
overlay on its LD_LIBRARY_PATH fails every run with "Cannot Open QNN library libQnnHtp.so"). Hence: start the
server with the device commands' environment (the toolchain's child_env puts the overlay on LD_LIBRARY_PATH).
A request whose LD_LIBRARY_PATH would find another libQnnHtp.so than the server's (say, one pushed to the
device workspace) is turned down, and the client runs it the slow way. Other variables read only at start-up
(OMP_*, PYTHON*, MALLOC_*) also stay the server's.

Wiring, one server per emulated device (start_server returns once the socket accepts runs):

    server = start_server(device_dir / "runner.sock", device_env)          # log: runner.sock.log
    device_env["QNNSUITE_RUNNER_SOCKET"] = str(device_dir / "runner.sock")  # for that device's commands
    ...
    stop_server(server)

The server writes its pid to PATH.pid; on SIGTERM it kills its children, reports them to their clients as
killed (137) and removes the socket and pid file.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from harness.emulator import host_runner
from harness.emulator.adbd import write_atomically
from harness.emulator.runner_client import MAX_MESSAGE_BYTES, STD_FDS, unix_address

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Imported by the server, never by the launcher that only calls start_server/stop_server.
PRELOADED_MODULES = ("numpy", "torch", "executorch.extension.pybindings.portable_lib")
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 5.0
SHUTDOWN_JOIN_S = 2.0  # under STOP_TIMEOUT_S, so stop_server need not escalate to SIGKILL
LISTEN_BACKLOG = 64
PR_SET_PDEATHSIG = 1
QNN_LIBRARY = "libQnnHtp.so"  # what ExecuTorch dlopens by name
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class RunnerServerError(RuntimeError):
    """The runner server did not come up; the message names its log."""


def pid_file_of(socket_path: Path) -> Path:
    return socket_path.with_name(socket_path.name + ".pid")


def log_file_of(socket_path: Path) -> Path:
    return socket_path.with_name(socket_path.name + ".log")


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


def qnn_libraries_mapped() -> list[str]:
    """libQnn* files mapped into this process: the server must have none, each child loads its own."""
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "/libQnn" in line})


class RunnerServer:
    """Accepts runs on a Unix socket: a thread per connection, a forked child per run."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
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
        write_atomically(pid_file_of(self.socket_path), str(os.getpid()))
        print(f"runner server: pid {os.getpid()} serving {self.socket_path}", flush=True)
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
        """One run: take the request, fork its child, then report its status or kill it when the client goes."""
        with connection:
            message, fds, _, _ = socket.recv_fds(connection, MAX_MESSAGE_BYTES, len(STD_FDS))
            try:
                if not message:
                    return
                request = json.loads(message)
                refusal = self.refusal(request)
                started = None if refusal else self.start_child(request, fds)
            finally:
                for fd in fds:
                    os.close(fd)
            if started is None:
                send(connection, {"refused": refusal or "the server is stopping"})
                return
            pid, pidfd = started
            child_ended = send(connection, {"started": pid}) and self.child_ends_first(connection, pidfd)
            status = self.reap(pid, pidfd, kill=not child_ended)
            if child_ended:
                send(connection, {"status": status})

    def refusal(self, request: dict) -> str | None:
        """Why this request cannot run here (the client then runs it itself), or None."""
        wanted = library_on_path(request["env"].get("LD_LIBRARY_PATH", ""), request["cwd"])
        loaded = library_on_path(self.library_path, request["cwd"])
        if wanted != loaded:
            return (f"its LD_LIBRARY_PATH finds {QNN_LIBRARY} at {wanted}, the server's at {loaded}; "
                    f"start the server with the device commands' environment")
        return None

    def start_child(self, request: dict, fds: list[int]) -> tuple[int, int] | None:
        """Fork the run's child; (pid, pidfd), or None once the server is stopping."""
        server_pid = os.getpid()
        with self.lock:
            if self.stopping:
                return None
            # Pending C stdio output of the server must not be flushed a second time, by the child.
            sys.stdout.flush()
            sys.stderr.flush()
            self.libc.fflush(None)
            pid = os.fork()
            if pid == 0:
                self.run_child(server_pid, request, fds)
            pidfd = os.pidfd_open(pid)
            self.children[pid] = pidfd
        return pid, pidfd

    def run_child(self, server_pid: int, request: dict, fds: list[int]) -> None:
        """In the child: take on the client's process state, run host_runner.main, and never return."""
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
            os.closerange(len(STD_FDS), os.sysconf("SC_OPEN_MAX"))
            os.chdir(request["cwd"])
            os.umask(request["umask"])
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv = [host_runner.__file__, *request["argv"]]
            # New stream objects: the server's may hold buffered output or a lock taken by another thread.
            sys.stdin = open(0, closefd=False) if 0 in request["fds"] else None
            sys.stdout = open(1, "w", closefd=False) if 1 in request["fds"] else None
            sys.stderr = (open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
                          if 2 in request["fds"] else None)
            code = exit_code(host_runner.main(request["argv"]))
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
            finally:
                os._exit(code)

    def child_ends_first(self, connection: socket.socket, pidfd: int) -> bool:
        """Wait until the child ends (True) or the client hangs up (False)."""
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(connection, select.POLLIN)
        return pidfd in dict(poller.poll())

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


def start_server(socket_path: Path, env: dict[str, str], timeout_s: float = START_TIMEOUT_S) -> subprocess.Popen[bytes]:
    """Start the runner server of one emulated device; return once it accepts runs.

    env: the device commands' environment (the toolchain's child_env): what a process reads only at start,
    like LD_LIBRARY_PATH for the dynamic loader, comes from here for every run. Its log is PATH.log.
    """
    socket_path = Path(socket_path).absolute()
    pid_file = pid_file_of(socket_path)
    pid_file.unlink(missing_ok=True)
    python = env.get("QNNSUITE_PYTHON") or sys.executable
    with open(log_file_of(socket_path), "wb") as log:
        process = subprocess.Popen([python, "-m", "harness.emulator.runner_server", "--socket", str(socket_path)],
                                   cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while not (pid_file.exists() and pid_file.read_text() == str(process.pid)):
        if process.poll() is not None:
            raise RunnerServerError(f"runner server exited {process.returncode}; see {log_file_of(socket_path)}")
        if time.monotonic() > deadline:
            stop_server(process)
            raise RunnerServerError(f"runner server not ready after {timeout_s:.0f} s; see {log_file_of(socket_path)}")
        time.sleep(0.05)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", type=Path, required=True, help="Unix socket to serve on")
    arguments = parser.parse_args()
    for name in PRELOADED_MODULES:
        importlib.import_module(name)
    mapped = qnn_libraries_mapped()
    if mapped:
        sys.exit(f"runner server: importing {', '.join(PRELOADED_MODULES)} mapped {', '.join(mapped)}; "
                 f"QNN libraries must load only in each run's child")
    RunnerServer(arguments.socket.absolute()).serve()


if __name__ == "__main__":
    main()
