"""--cache-dir as another local account would attack it: through a parent it may write, and through entries
it owns. Each test is the attack, and it fails."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fixtures import zoo  # noqa: F401  (registers the cards)
from harness import options as run_options
from harness.pipeline import cache, card as cards, eager, references
from harness.pipeline.facts import LoweringError, LoweringFacts
from harness.pipeline.lowering_cache import is_lowered, served
from harness.user_state import claim_entry
from harness.vocabulary import Case, Mode

OTHER = 65534  # nobody
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another account needs root")


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_a_cache_dir_below_a_parent_others_may_write_is_refused(tmp_path: Path, mode: int) -> None:
    """The attack: the cache folder itself is 0700 and the user's, but its parent lets another account
    rename it away after the check and put a folder of planted entries in its place."""
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(mode)
    with pytest.raises(pytest.UsageError, match=r"its parent .*shared has mode .* \(others may swap what it holds\)"):
        run_options.trusted_cache_dir(parent / "cache")
    parent.chmod(0o755)
    assert run_options.trusted_cache_dir(parent / "cache") == (parent / "cache").resolve()


def test_a_sticky_parent_such_as_tmp_is_accepted(tmp_path: Path) -> None:
    """In a sticky folder (/tmp's 1777) only an entry's owner may rename or remove it: nothing to swap."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert run_options.trusted_cache_dir(sticky / "cache") == (sticky / "cache").resolve()


@needs_root
def test_a_cache_dir_below_a_parent_another_uid_owns_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    (parent / "cache").mkdir(mode=0o700)
    os.chown(parent, OTHER, OTHER)
    with pytest.raises(pytest.UsageError, match=f"its parent .*theirs belongs to uid {OTHER}") as refused:
        run_options.trusted_cache_dir(parent / "cache")
    assert "\n" not in str(refused.value)


@needs_root
def test_a_shared_subfolder_another_uid_owns_is_refused(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    (cache_dir / "prepared").mkdir(parents=True)
    os.chown(cache_dir / "prepared", OTHER, OTHER)
    with pytest.raises(pytest.UsageError, match=f"prepared belongs to uid {OTHER}"):
        run_options.trusted_cache_dir(cache_dir)


def _lowering_entry(folder: Path) -> Path:
    """A lowering entry served as it is (a case's own lowering failure needs no program)."""
    folder.mkdir(parents=True)
    LoweringFacts(error=LoweringError("RuntimeError", "unsupported op")).write(folder / "facts.json")
    (folder / "lower.log").write_text("")
    return folder


@needs_root
@pytest.mark.parametrize("owned", ["folder", "file in it"])
def test_a_cached_lowering_another_uid_owns_is_not_served(tmp_path: Path, capsys, owned: str) -> None:
    """The attack: an entry another account left in the cache (when it could write there) holds its facts
    and program; it is set aside and lowered again, never served nor written into."""
    entry = _lowering_entry(tmp_path / "cache" / "counter_add-fp16-delegate_mutbuf-SM8650-0123")
    os.chown(entry if owned == "folder" else entry / "facts.json", OTHER, OTHER)
    assert not is_lowered(entry), "the run must not count on it (no lowering server would start)"
    claim_entry(entry, "cached lowering")
    assert served(SimpleNamespace(id="counter_add-fp16"), entry) is None and not entry.exists()
    (line,) = capsys.readouterr().err.splitlines()
    assert f"uid {OTHER}" in line and "not served, moved aside to" in line
    (aside,) = entry.parent.glob(".foreign-*")
    assert (aside / "facts.json").is_file(), "another account's files are moved, never removed or read"


def test_the_user_s_own_entry_is_served(tmp_path: Path, capsys) -> None:
    entry = _lowering_entry(tmp_path / "cache" / "counter_add-fp16-delegate_mutbuf-SM8650-0123")
    claim_entry(entry, "cached lowering")
    assert is_lowered(entry) and served(SimpleNamespace(id="counter_add-fp16"), entry) is not None
    assert capsys.readouterr().err == ""


@needs_root
def test_eager_results_another_uid_owns_are_not_read(tmp_path: Path, monkeypatch) -> None:
    """Planted eager results (the references every check compares with) would make a wrong program pass."""
    monkeypatch.setattr(references, "_MEMO", {})
    monkeypatch.setattr(eager, "_OUTPUTS", {})
    case = Case(cards.find("fixtures.zoo:counter_add"), "fp16", Mode.DELEGATE, "SM8650")
    steps = case.card.steps(4)
    truth = references.eager_results(case, steps, tmp_path / "truth")
    monkeypatch.setattr(references, "_MEMO", {})
    planted = tmp_path / "cache" / "eager" / f"{cache.eager_key(case, len(steps))}.npz"
    planted.parent.mkdir(parents=True)
    (truth_file,) = (tmp_path / "truth" / "eager").glob("*.npz")
    with np.load(truth_file) as entry:
        np.savez(planted, **{name: np.zeros_like(entry[name]) for name in entry.files})
    os.chown(planted, OTHER, OTHER)
    got = references.eager_results(case, steps, tmp_path / "cache")
    assert all(np.array_equal(a, b) for row, want in zip(got.reference, truth.reference) for a, b in zip(row, want))
    assert planted.stat().st_uid == os.getuid(), "this user's own results took its place"


@needs_root
def test_a_lock_file_another_uid_left_is_set_aside_not_opened(tmp_path: Path, capsys) -> None:
    """filelock opens KEY.lock following links and truncating: another account's link there (left when it
    could write the cache) would have truncated whatever it names, as this user (or root)."""
    from harness.pipeline import prepared

    victim = tmp_path / "victim"
    victim.write_text("precious")
    entry = tmp_path / "cache" / "prepared" / "counter_add-fp16-0123"
    entry.parent.mkdir(parents=True)
    lock = Path(f"{entry}.lock")
    lock.symlink_to(victim)
    os.chown(lock, OTHER, OTHER, follow_symlinks=False)
    with prepared._locked(entry):
        pass
    assert victim.read_text() == "precious" and not lock.is_symlink()
    assert "cache lock counter_add-fp16-0123.lock belongs to uid 65534" in capsys.readouterr().err
