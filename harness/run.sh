#!/usr/bin/env bash
# The README's two commands:   harness/run.sh suite [pytest args]   |   harness/run.sh tests [pytest args]
# (and harness/run.sh doctor). Each first makes sure the environment is in place, doing nothing slow
# when it already is: a git-ignored venv with the pins of requirements.txt, the QNN host tree laid out
# from the onnxruntime-qnn wheel, the interposer built and the bridge probed (both cached in .qnn/).
#
# QNNSUITE_EXECUTORCH picks the executorch under test: unset = the pin in requirements.txt;
#   a version (1.6.0), a requirement (executorch==1.6.0.dev20261129), a wheel file path, or
#   "installed" = keep whatever the venv has (e.g. `pip install -e` of a source build).
# QNNSUITE_VENV uses another virtual environment instead of .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
  suite|tests|doctor) ;;
  *) echo "usage: harness/run.sh suite|tests|doctor [pytest args]" >&2; exit 2 ;;
esac

venv=${QNNSUITE_VENV:-.venv}
choice=${QNNSUITE_EXECUTORCH:-pinned}
python_bin=$(command -v python3.11 || command -v python3)
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv" >&2
  "$python_bin" -m venv "$venv"
fi

case "$choice" in
  pinned) executorch=$(grep -E '^executorch==' requirements.txt) ;;
  installed) executorch="" ;;
  *.whl) [ -f "$choice" ] || { echo "setup: QNNSUITE_EXECUTORCH=$choice: no such wheel file; give an existing .whl path" >&2; exit 2; }
         executorch=$(realpath "$choice") ;;
  executorch*) executorch=$choice ;;
  *) executorch="executorch==$choice" ;;
esac

stamp_file="$venv/.qnnsuite-stamp"
wheel_mtime=$( [ -f "$executorch" ] && stat -c %Y "$executorch" || true)
stamp=$( (cat requirements.txt; echo "$executorch $wheel_mtime") | sha256sum | cut -c1-32)
if [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp" ]; then
  echo "setup: installing pinned packages into $venv (first run takes a few minutes)" >&2
  grep -vE '^executorch==' requirements.txt > "$venv/.requirements-without-executorch.txt"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$venv/.requirements-without-executorch.txt" ${executorch:+"$executorch"}
  echo "$stamp" > "$stamp_file"
fi
"$venv/bin/python" -c 'import executorch' 2>/dev/null || {
  echo "setup: executorch is not importable from $venv: unset QNNSUITE_EXECUTORCH or install one into $venv" >&2; exit 2; }

# Emulated devices jail their shells with bubblewrap (harness/emulator/jail.py); without it they fall back to
# path checks, so a failed install only weakens the sandbox and the run goes on (the device log says which).
if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "setup: installing bubblewrap (Debian package) for the emulated devices' jailed shells" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) >/dev/null 2>&1 ||
    echo "setup: could not install bubblewrap; emulated device shells are path-checked only" >&2
fi

if [ "$command" = doctor ]; then
  exec "$venv/bin/python" -m harness doctor "$@"
fi
"$venv/bin/python" -m harness setup
if [ "$command" = tests ]; then
  # The pinned ruff (ruff.toml) first: a lint or format problem fails the tests like any other.
  "$venv/bin/ruff" check --quiet . || { echo "tests: ruff check failed: fix the lines above (ruff check --fix . fixes many)" >&2; exit 1; }
  "$venv/bin/ruff" format --check --quiet . || { echo "tests: files not formatted: run $venv/bin/ruff format ." >&2; exit 1; }
  # Two workers, a test file each at a time (a file's module fixtures, e.g. a suite run, are made once):
  # most tests wait on suite runs and devices, so serial the tests took 29 min on 2 cores, with two 18.
  # The slowest tests by name, so a CI log says where its time went (the budget is 30 minutes).
  exec "$venv/bin/python" -m pytest harness/tests -n 2 --dist loadfile --durations=25 "$@"
fi
# Every core unless told otherwise: a newcomer's first run is not serial (-n / --numprocesses / -p no:xdist win).
workers=(-n auto)
for argument in "$@"; do
  case "$argument" in -n|-n*|--numprocesses|--numprocesses=*|no:xdist) workers=() ;; esac
done
exec "$venv/bin/python" -m pytest suites "${workers[@]}" "$@"
