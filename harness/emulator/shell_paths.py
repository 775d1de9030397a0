"""Device shells without a jail: device paths rewritten into the sandbox, host paths refused.

Used only where bubblewrap cannot run (harness.emulator.jail says why). This is a guard, not a wall: a
command that reaches the host by relative paths (`cd ..`) or computed ones (`$HOME`) is not seen. What it
does make safe is the rewriting itself: the sandbox root is inserted quoted for the quoting context it
lands in, so a root with a space, a quote, `;` or `$(...)` stays one word of the command.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import Path

from harness.emulator.device_fs import DEVICE_TOP_DIRS

# A path starts a token: at the start, after whitespace, `=`, `:` (path lists), quotes or shell operators.
_TOKEN_START = r"(?<![^\s='\":;(|&<>`])"
_TOKEN_END = r"[/\s'\":;)|&<>`]|$"
_DEVICE_PATH = re.compile(_TOKEN_START + r"/(?:" + "|".join(DEVICE_TOP_DIRS) + r")(?=" + _TOKEN_END + r")")
_ABSOLUTE_PATH = re.compile(_TOKEN_START + r"/[^\s'\":;)|&<>`]*")
# Host files a device shell may name: the ones every Android shell has too.
HOST_PATHS_ALLOWED = ("/dev/null", "/dev/zero", "/dev/urandom")


def quote_states(command: str) -> list[str]:
    """For each character, the quoting it is read in: "" (none), "'" or '"'."""
    states, state, escaped = [], "", False
    for char in command:
        states.append(state)
        if escaped:
            escaped = False
        elif state == "'":
            state = "" if char == "'" else state
        elif char == "\\":
            escaped = True
        elif state == '"':
            state = "" if char == '"' else state
        elif char in "'\"":
            state = char
    return states


def quoted_for(text: str, state: str) -> str:
    """`text` written so that the shell reads it literally inside the given quoting."""
    if state == "'":
        return text.replace("'", "'\\''")
    if state == '"':
        return re.sub(r'([\\"$`])', r"\\\1", text)
    return shlex.quote(text)


def rewrite_device_paths(command: str, root: Path) -> str:
    """Prefix absolute device paths in a shell command with the sandbox root, so commands touch the sandbox."""
    root_text = str(root)
    states = quote_states(command)

    def prefix(match: re.Match[str]) -> str:
        start = match.start()
        if command.startswith(root_text + "/", start):
            return match.group(0)  # already inside
        if states[start] and command[start - 1] not in "'\"=:":
            return match.group(0)  # inside a quoted word, after a space or `;`: part of that word, not a path
        return quoted_for(root_text, states[start]) + match.group(0)

    return _DEVICE_PATH.sub(prefix, command)


def host_paths_named(command: str, root: Path) -> list[str]:
    """Absolute paths in a device command that lead to the host outside the sandbox."""
    root_text = str(root)
    outside = []
    for match in _ABSOLUTE_PATH.finditer(command):
        path = match.group(0)
        normal = posixpath.normpath(path)
        if path.startswith(root_text + "/") or path == root_text:
            inside = normal == root_text or normal.startswith(root_text + "/")
        else:
            inside = normal.split("/")[1] in DEVICE_TOP_DIRS or normal in HOST_PATHS_ALLOWED
        if not inside:
            outside.append(path)
    return outside


def refusal(command: str, root: Path) -> str | None:
    """The line a device answers a command with that names host paths, or None for a command it may run."""
    outside = host_paths_named(command, root)
    if not outside:
        return None
    return (
        f"emulated device: refused, {', '.join(outside[:3])} is outside the device sandbox (no bubblewrap "
        f"here, so device shells are only path-checked): use device paths under "
        f"{', '.join('/' + name for name in DEVICE_TOP_DIRS)}"
    )
