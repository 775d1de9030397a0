"""SoC table: name -> chipset enum, HTP arch and VTCM, read from the ExecuTorch under test.

Taken from executorch (qc_schema) rather than copied, so a new SoC in trunk is known here at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache


class UnknownSocError(ValueError):
    """A SoC name that the ExecuTorch under test does not know."""


@dataclass(frozen=True)
class Soc:
    name: str
    chipset: int  # QcomChipset value, as the compiler spec takes it
    htp_arch: int  # 68, 69, 73, 75, 79, 81 ...
    vtcm_mb: int


@cache
def table() -> dict[str, Soc]:
    from executorch.backends.qualcomm.serialization import qc_schema

    socs: dict[str, Soc] = {}
    for chipset, info in qc_schema._soc_info_table.items():
        htp = getattr(info, "htp_info", None)
        if htp is None or int(htp.htp_arch) == 0:
            continue  # not an HTP part (e.g. LPAI only)
        socs[chipset.name] = Soc(chipset.name, int(chipset), int(htp.htp_arch), int(htp.vtcm_size_in_mb))
    return socs


def lookup(name: str) -> Soc:
    socs = table()
    soc = socs.get(name.strip().upper())
    if soc is None:
        raise UnknownSocError(f"unknown SoC {name!r}: the ExecuTorch under test knows {', '.join(sorted(socs))}")
    return soc
