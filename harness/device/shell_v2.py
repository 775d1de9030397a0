"""The shell v2 protocol read with bounded buffers: a device command's stdout and stderr keep their last
OUTPUT_KEEP_BYTES each, and what was dropped is counted in front of what is kept.

adbutils keeps a command's whole output in memory (three copies: stdout, stderr and both): a runner writing
to stderr without end grew a worker to 1.56 GB in 6 s, and its timeout allowed some 21 GB. What explains a
failure is at the end (the runner's last words), so the end is what is kept.
"""

from __future__ import annotations

from adbutils import AdbConnection
from adbutils._proto import ShellReturnRaw

OUTPUT_KEEP_BYTES = 8 * 1024 * 1024  # per stream, and for the two interleaved
STDOUT, STDERR, EXIT = 1, 2, 3  # shell v2 packet ids (adb's shell_protocol.h)


class Tail:
    """The last `keep` bytes written, and how many came before them."""

    def __init__(self, keep: int) -> None:
        self.keep, self.dropped = keep, 0
        self._data = bytearray()

    def write(self, chunk: bytes) -> None:
        self._data += chunk
        if len(self._data) > 2 * self.keep:  # trimmed now and then, so a byte is moved about once
            cut = len(self._data) - self.keep
            del self._data[:cut]
            self.dropped += cut

    def value(self) -> bytes:
        """What is kept, behind one line that counts what was dropped (when anything was)."""
        extra = max(0, len(self._data) - self.keep)
        dropped = self.dropped + extra
        note = f"... {dropped} bytes dropped (only the last {self.keep} are kept)\n".encode() if dropped else b""
        return note + bytes(self._data[extra:])


def read(connection: AdbConnection, command: str, keep: int | None = None) -> ShellReturnRaw:
    """Read a `shell,v2:` command's packets until its exit (the connection has been answered OKAY)."""
    keep = OUTPUT_KEEP_BYTES if keep is None else keep
    stdout, stderr, both = Tail(keep), Tail(keep), Tail(keep)
    exit_code = 255
    while True:
        header = connection.read_exact(5)
        length = int.from_bytes(header[1:5], "little")
        data = connection.read_exact(length) if length else b""
        if header[0] == STDOUT:
            stdout.write(data)
            both.write(data)
        elif header[0] == STDERR:
            stderr.write(data)
            both.write(data)
        elif header[0] == EXIT and data:
            exit_code = data[0]
            break
    return ShellReturnRaw(
        command=command, returncode=exit_code, output=both.value(), stderr=stderr.value(), stdout=stdout.value()
    )
