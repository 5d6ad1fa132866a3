"""Things made once per pytest run and shared by its tests, across xdist workers too.

With pytest-xdist each worker is its own process with its own session fixtures, so a
session fixture alone would build the synthetic project or run the stock gate once per
worker. ``once_per_run`` makes the thing in a directory every worker of this run sees
(beside the workers' own base temporary directories, named by xdist's run id), under a
file lock (``waitlock.make_once``): the first worker makes it, the others wait for the
lock and load what it made. A directory without its ``.done`` marker (a worker that
crashed while making it) is made again, never loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from xla_host.waitlock import make_once

T = TypeVar("T")


def shared_dir(factory: pytest.TempPathFactory) -> Path:
    """A directory shared by every worker of this pytest run, and by no other run."""
    base = factory.getbasetemp()
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:
        # Not under xdist: one process, its own base temporary directory is the run's.
        return base / "once-per-run"
    # The workers' base directories (popen-gw0, ...) are siblings in this run's directory.
    return base.parent / f"once-per-run-{run_id}"


def once_per_run(
    factory: pytest.TempPathFactory,
    name: str,
    make: Callable[[Path], None],
    load: Callable[[Path], T],
) -> T:
    """``load(dir)`` after ``make(dir)`` ran once in this pytest run for ``name``."""

    def make_recorded(directory: Path) -> dict[str, object]:
        make(directory)
        return {"made": name}

    # In place: what is made names its own path (a gate report, the TMPDIR it ran with).
    directory = make_once(
        shared_dir(factory) / name,
        make_recorded,
        marker=".done",
        doing=f"making {name} for this test run",
        in_place=True,
    )
    return load(directory)
