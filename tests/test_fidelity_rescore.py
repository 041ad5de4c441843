"""benchmarks/fidelity.py --rescore reads a finished run back from wherever it now lies."""

from __future__ import annotations

from pathlib import Path

from benchmarks.fidelity import moved_replays


def test_a_moved_or_copied_run_reads_its_own_replays(tmp_path: Path) -> None:
    original = tmp_path / "first" / "run"
    copy = tmp_path / "second" / "run"
    for run in (original, copy):
        (run / "loaded-replays" / "burst").mkdir(parents=True)
    (original / "loaded-replays" / "poisson-50").mkdir(parents=True)
    entries = [
        {"name": "burst", "directory": str(original / "loaded-replays" / "burst")},
        {"name": "poisson 50%", "directory": str(original / "loaded-replays" / "poisson-50")},
        {"name": "poisson 85%", "directory": str(tmp_path / "gone" / "poisson-85")},
    ]
    found = moved_replays(entries, copy)
    # The copy's own replay, though the original still exists; the original where the copy
    # lacks one; the recorded path where neither has it (the reader then names it).
    assert found[0]["directory"] == str(copy / "loaded-replays" / "burst")
    assert found[1]["directory"] == str(original / "loaded-replays" / "poisson-50")
    assert found[2]["directory"] == str(tmp_path / "gone" / "poisson-85")
    assert found[0]["name"] == "burst" and entries[0]["directory"].startswith(str(original))
