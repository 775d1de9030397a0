"""The artifact cache serves only what it can vouch for: a truncated model.pte or facts.json is lowered
again (with one line saying so), a failure of the machine (no space left) is never kept, and the key
changes with what shapes a program but hides behind no version string (bridge, interposer, builds)."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from fixtures import zoo  # noqa: F401  (registers the cards)
from harness.case_store import CaseStore
from harness.pipeline import cache, card as cards
from harness.tests import broken_cards
from harness.versions import _tree_identity, build_identity
from harness.vocabulary import Case, Mode

pytestmark = pytest.mark.qnn
CASE = Case(cards.find("fixtures.zoo:kv_index_copy_dim1"), "fp16", Mode.SKIP, "SM8650")


def _store(toolchain, tmp_path: Path, cache_dir: Path) -> CaseStore:
    """A fresh worker's store (nothing memoized), lowering without a server, no devices."""
    return CaseStore(toolchain, None, tmp_path / "work", "gw0", lambda tags: 4, 60.0, cache_dir, None)


@pytest.fixture(scope="module")
def cached(toolchain, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cache")
    artifact = _store(toolchain, root, root / "cache").lowered(CASE).artifact
    assert artifact.ok and not artifact.cached, artifact.failure
    assert artifact.facts.program is not None and artifact.facts.program.bytes == artifact.pte.stat().st_size
    again = _store(toolchain, root, root / "cache").lowered(CASE).artifact
    assert again.cached and again.directory == artifact.directory
    return root, artifact.directory


@pytest.mark.parametrize("damage", ["truncated model.pte", "truncated facts.json"])
def test_a_damaged_entry_is_lowered_again(toolchain, cached, tmp_path, capfd, damage):
    root, directory = cached
    target = directory / damage.split()[-1]
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    artifact = _store(toolchain, tmp_path, root / "cache").lowered(CASE).artifact
    assert artifact.ok and not artifact.cached, artifact.failure
    line = next(line for line in capfd.readouterr().err.splitlines() if "is damaged" in line)
    expected = "model.pte has" if damage == "truncated model.pte" else "unreadable facts"
    assert line.startswith(f"qnnsuite: cached lowering of {CASE.id} is damaged (") and expected in line
    assert line.endswith("lowering it again")
    assert _store(toolchain, tmp_path, root / "cache").lowered(CASE).artifact.cached, "the re-lowered entry is served"


def test_no_space_left_is_reported_and_not_cached(toolchain, tmp_path):
    """(The card fails to build anywhere, so its eager reference cannot be made: lowered once, directly.)"""
    case = Case(broken_cards.DISK_FULL, "fp16", Mode.DELEGATE, "SM8650")
    first = _store(toolchain, tmp_path, tmp_path / "cache")._lower_once(case, 4)
    assert not first.ok and first.failure.startswith("lowering failed: OSError: [Errno 28] No space left on device")
    assert first.facts.error.environmental and not (first.directory / "facts.json").exists()
    second = _store(toolchain, tmp_path, tmp_path / "cache")._lower_once(case, 4)
    assert not second.cached, "a full disk is the machine's state, not the case's: lowered again next time"


def test_a_deterministic_failure_is_cached(toolchain, tmp_path):
    """The counterpart: a lowering that fails for the case's own reasons is kept (it would fail again)."""
    case = Case(broken_cards.MISDECLARED, "fp16", Mode.DELEGATE, "SM8650")
    first = _store(toolchain, tmp_path, tmp_path / "cache").lowered(case).artifact
    second = _store(toolchain, tmp_path, tmp_path / "cache").lowered(case).artifact
    assert second.cached and second.facts.error == first.facts.error


def test_the_key_covers_the_bridge_and_the_interposer(toolchain, monkeypatch, tmp_path):
    plain = cache.key(CASE, 4, toolchain)
    bridged = dataclasses.replace(
        toolchain,
        probe=dataclasses.replace(toolchain.probe, bridge_device_config=not toolchain.probe.bridge_device_config),
    )
    assert cache.key(CASE, 4, bridged) != plain
    source = tmp_path / "interposer.c"
    source.write_text(cache.INTERPOSER_SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(cache, "INTERPOSER_SOURCE", source)
    assert cache.key(CASE, 4, toolchain) != plain


def test_build_identity_is_by_content():
    assert build_identity("executorch").startswith("record:"), "a wheel install is known by its RECORD"
    assert build_identity("no-such-package-xyz") == "not installed"


def test_a_wheel_file_patched_in_place_changes_the_identity(tmp_path, monkeypatch):
    """A regression injected by editing an installed file keeps the wheel's RECORD: the identity must still
    change, or a warm cache would serve lowerings made before the patch."""
    package, info = tmp_path / "patchme", tmp_path / "patchme-1.0.dist-info"
    package.mkdir()
    info.mkdir()
    (package / "__init__.py").write_text("A = 1\n")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: patchme\nVersion: 1.0\n")
    (info / "RECORD").write_text("patchme/__init__.py,sha256=x,6\npatchme-1.0.dist-info/METADATA,,\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    build_identity.cache_clear()
    installed = build_identity("patchme")
    assert installed.startswith("record:")
    build_identity.cache_clear()
    assert build_identity("patchme") == installed, "nothing changed: the same identity"
    (package / "__init__.py").write_text("A = 2\n")  # same size; mtime may even be restored with touch -r
    build_identity.cache_clear()
    try:
        assert build_identity("patchme") != installed
    finally:
        build_identity.cache_clear()


def test_an_editable_checkout_is_known_by_commit_and_changes(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            check=True,
            capture_output=True,
        )

    (tmp_path / "module.py").write_text("A = 1\n")
    git("init", "-q")
    git("add", "module.py")
    git("commit", "-qm", "one")
    first = _tree_identity(tmp_path)
    (tmp_path / "module.py").write_text("A = 2\n")  # a rebuilt editable install keeps its version string
    changed = _tree_identity(tmp_path)
    git("commit", "-qam", "two")
    assert len({first, changed, _tree_identity(tmp_path)}) == 3


def test_the_key_covers_every_pipeline_module_the_lowering_child_runs():
    """A harness change to how a program is made (e.g. the Meta llama flow) must not be served from the cache."""
    import ast

    here = Path(cache.__file__).parent
    seen, pending = set(), ["lower_job.py"]
    while pending:
        name = pending.pop()
        seen.add(name)
        for node in ast.walk(ast.parse((here / name).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "harness.pipeline":
                found = [f"{alias.name}.py" for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness.pipeline."):
                found = [node.module.rpartition(".")[2] + ".py"]
            else:
                continue
            pending += [module for module in found if module not in seen]
    assert seen <= set(cache.LOWERING_SOURCES), f"not in the key: {sorted(seen - set(cache.LOWERING_SOURCES))}"
