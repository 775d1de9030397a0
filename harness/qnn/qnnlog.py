"""Reading QNN/ExecuTorch logs: which lines are errors, and which known library noise is not.

Kept in one place so a reader can see every line the suite forgives and why.
"""

from __future__ import annotations

import re

ERROR_LINE = re.compile(r"\[ERROR\]|<E>|\bE \d\d:\d\d:\d\d\.\d+ executorch:")
API_VERSIONS = re.compile(r"Qnn API version (\d+\.\d+\.\d+) is used\. The version is tested against (\d+\.\d+\.\d+)")

# QAIRT 2.51's libQnnHtp prints this from graphCreate even when the client passes no backend,
# context, device or graph config at all (measured by filtering every config out in the
# interposer), and graph creation still returns QNN_SUCCESS. So it is the library's own noise,
# not an ABI gap in what ExecuTorch sends; see docs/ARCHITECTURE.md#host-qnn-toolchain-harnessqnn.
KNOWN_LIBRARY_NOISE = (re.compile(r"<E> unexpected GraphHtpSettings option 66$"),)


def error_lines(log: str) -> list[str]:
    """Lines that report an error, minus documented library noise."""
    found = []
    for line in log.splitlines():
        line = line.rstrip()
        if ERROR_LINE.search(line) and not any(noise.search(line) for noise in KNOWN_LIBRARY_NOISE):
            found.append(line)
    return found


def api_versions(log: str) -> tuple[str | None, str | None]:
    """(QNN API version the library has, the one ExecuTorch was tested against), from its warning."""
    match = API_VERSIONS.search(log)
    return (match.group(1), match.group(2)) if match else (None, None)
