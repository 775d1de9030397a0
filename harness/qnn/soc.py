"""SoC table: name -> chipset enum, HTP arch and VTCM, read from the ExecuTorch under test.

Taken from executorch (qc_schema) rather than copied, so a new SoC in trunk is known here at once.
"""

from __future__ import annotations

import re
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


# What phones put in ro.board.platform (and some kernels in /sys/devices/soc0/machine): Qualcomm's platform
# codename. From shipping phones' build properties: SM8350 lahaina, SM8450 taro, SM8475 taro as well (its own
# codename cape shows on some builds), SM8550 kalama, SM8650 pineapple, SM8750 sun, SM8850 canoe. taro alone
# cannot tell SM8450 from SM8475, so it decides nothing by itself. Only SoCs the table above knows count.
PLATFORM_CODENAMES = {
    "lahaina": ("SM8350",),
    "taro": ("SM8450", "SM8475"),
    "cape": ("SM8475",),
    "kalama": ("SM8550",),
    "pineapple": ("SM8650",),
    "sun": ("SM8750",),
    "canoe": ("SM8850",),
}
_PART_NUMBER = re.compile(r"[A-Z]{2,4}\d{4}[A-Z]{0,2}")


def named_by(value: str) -> tuple[str, ...]:
    """The SoCs of the table a reported value names: a part number in any spelling (`SM8650`, `sm8650`,
    `SM8650-AB`, `SM8650P` when the table knows no `SM8650P`), or a platform codename (`pineapple`)."""
    text = value.strip()
    socs = table()
    if text.lower() in PLATFORM_CODENAMES:
        return tuple(name for name in PLATFORM_CODENAMES[text.lower()] if name in socs)
    match = _PART_NUMBER.match(text.upper())
    if not match:
        return ()
    part = match.group(0)
    for candidate in (part, part.rstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZ")):
        if candidate in socs:
            return (candidate,)
    return ()
