"""Installed package versions, for the doctor, the reports and the artifact cache key."""
from __future__ import annotations

from importlib import metadata


def package_version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"
