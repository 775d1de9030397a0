"""Reproduction bundles: for every failing case, the files and the standalone repro.py a maintainer needs to
see the failure without this suite (bundle.py writes them, issue.md via issue.py, standalone.py is repro.py,
layout.py says where they live, rerun.py is `python -m harness repro`, exports.py the shell lines that give
repro.py the suite's toolchain)."""
