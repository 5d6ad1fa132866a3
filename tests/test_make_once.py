"""make_once: a per-machine cache entry is made by one maker; an unfinished one is never done.

Real directories, a real ``flock`` and real threads (each opens the lock file itself, so
the threads exclude each other as two processes would).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from xla_host.waitlock import make_once

MARKER = "done.json"


def _maker(calls: list[Path], started: threading.Event | None = None, hold: float = 0.0):
    def make(tmp: Path) -> dict[str, object]:
        calls.append(tmp)
        (tmp / "payload").write_text("made\n")
        if started is not None:
            started.set()
            threading.Event().wait(hold)  # holding the lock while a second maker arrives
        return {"made_in": tmp.name}

    return make


def test_a_made_entry_carries_the_marker_and_is_reused(tmp_path: Path) -> None:
    calls: list[Path] = []
    target = tmp_path / "cache" / "entry"
    assert make_once(target, _maker(calls), marker=MARKER, doing="making entry") == target
    assert make_once(target, _maker(calls), marker=MARKER, doing="making entry") == target
    assert len(calls) == 1
    assert (target / "payload").read_text() == "made\n"
    assert json.loads((target / MARKER).read_text()) == {"made_in": calls[0].name}
    # What is left next to it: the entry and its lock, no temporary directory.
    assert sorted(p.name for p in target.parent.iterdir()) == ["entry", "entry.lock"]


def test_a_second_maker_waits_for_the_first_and_reuses_its_entry(tmp_path: Path) -> None:
    first_calls: list[Path] = []
    second_calls: list[Path] = []
    target = tmp_path / "entry"
    started = threading.Event()
    first = threading.Thread(
        target=make_once,
        args=(target, _maker(first_calls, started, hold=1.0)),
        kwargs={"marker": MARKER, "doing": "making entry"},
    )
    first.start()
    assert started.wait(30)
    results: list[Path] = []
    second = threading.Thread(
        target=lambda: results.append(
            make_once(target, _maker(second_calls), marker=MARKER, doing="making entry")
        )
    )
    second.start()
    second.join(0.5)
    assert second.is_alive(), "the second maker did not wait for the lock"
    first.join(30)
    second.join(30)
    assert results == [target]
    assert len(first_calls) == 1 and second_calls == []


def test_a_failing_maker_leaves_nothing_that_is_taken_as_done(tmp_path: Path) -> None:
    target = tmp_path / "entry"

    def broken(tmp: Path) -> dict[str, object]:
        (tmp / "payload").write_text("half\n")
        raise RuntimeError("download failed")

    with pytest.raises(RuntimeError, match="download failed"):
        make_once(target, broken, marker=MARKER, doing="making entry")
    assert [p.name for p in tmp_path.iterdir()] == ["entry.lock"]
    calls: list[Path] = []
    make_once(target, _maker(calls), marker=MARKER, doing="making entry")
    assert len(calls) == 1


def test_a_killed_makers_leftovers_are_cleared_and_made_again(tmp_path: Path) -> None:
    # What a maker killed half-way leaves: its temporary sibling, or an entry without marker.
    target = tmp_path / "entry"
    (tmp_path / ".entry.tmp-crashed").mkdir()
    target.mkdir()
    (target / "half-made").write_text("")
    (tmp_path / "someone-elses-entry").mkdir()
    calls: list[Path] = []
    make_once(target, _maker(calls), marker=MARKER, doing="making entry")
    assert len(calls) == 1
    assert not (tmp_path / ".entry.tmp-crashed").exists()
    assert not (target / "half-made").exists()
    assert (tmp_path / "someone-elses-entry").exists()


def test_an_entry_that_is_marked_but_unusable_is_made_again(tmp_path: Path) -> None:
    target = tmp_path / "entry"
    calls: list[Path] = []
    make_once(target, _maker(calls), marker=MARKER, doing="making entry")
    (target / "payload").unlink()
    make_once(
        target,
        _maker(calls),
        marker=MARKER,
        doing="making entry",
        usable=lambda entry: (entry / "payload").is_file(),
    )
    assert len(calls) == 2
    assert (target / "payload").is_file()


def test_an_in_place_maker_fills_the_target_itself_and_a_half_made_one_is_made_again(
    tmp_path: Path,
) -> None:
    # For results that name their own path: the maker sees the target, never a sibling.
    target = tmp_path / "entry"

    def broken(directory: Path) -> dict[str, object]:
        (directory / "payload").write_text("half\n")
        raise RuntimeError("gate run failed")

    with pytest.raises(RuntimeError, match="gate run failed"):
        make_once(target, broken, marker=MARKER, doing="making entry", in_place=True)
    assert not (target / MARKER).exists()
    calls: list[Path] = []
    make_once(target, _maker(calls), marker=MARKER, doing="making entry", in_place=True)
    make_once(target, _maker(calls), marker=MARKER, doing="making entry", in_place=True)
    assert calls == [target]
    assert (target / "payload").read_text() == "made\n"
    assert json.loads((target / MARKER).read_text()) == {"made_in": "entry"}
