"""A slice's board as files in a directory every worker sees (``--slice-dir``, a shared
mount): ``<dir>/<phase>/worker-<N>.json`` written by rename (a reader never sees half a
file), ``<dir>/alive/worker-<N>`` the heartbeats, ``<dir>/start/worker-<N>.json`` the
claims, ``<dir>/finished.json`` once worker 0 recorded the results (a finished run's
directory is refused). A directory does not die: worker 0 gone shows as its heartbeat no
longer moving."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xla_host import filemode
from xla_host.gate.slice.barrier import Arrival
from xla_host.gate.slice.spec import WRITER


class DirectoryBoard:
    """Where the workers meet: files in a directory every worker sees (``--slice-dir``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def where(self) -> str:
        return str(self.directory)

    def claim(self, worker: int, who: Mapping[str, Any]) -> bool:
        """Register ``worker``; False when a finished run or this worker number used it."""
        (self.directory / "start").mkdir(parents=True, exist_ok=True)
        (self.directory / "alive").mkdir(parents=True, exist_ok=True)
        mine = self.directory / "start" / f"worker-{worker}.json"
        return not (self.directory / "finished.json").exists() and _create(mine, json.dumps(who))

    def put(self, section: str, arrival: Arrival) -> None:
        where = self.directory / section
        where.mkdir(parents=True, exist_ok=True)
        filemode.write_by_rename(
            where / f"worker-{arrival.worker}.json",
            json.dumps(arrival.__dict__, sort_keys=True) + "\n",
        )

    def arrivals(self, section: str) -> dict[int, Arrival]:
        return _read_arrivals(self.directory / section)

    def beat(self, worker: int, value: str) -> None:
        filemode.write_by_rename(self.directory / "alive" / f"worker-{worker}", value)

    def beats(self, workers: int) -> dict[int, str]:
        seen = {}
        for worker in range(workers):
            with contextlib.suppress(OSError):
                path = self.directory / "alive" / f"worker-{worker}"
                seen[worker] = filemode.read_shared(path, what="heartbeat").decode()
        return seen

    def finish(self, worker: int) -> None:
        if worker == WRITER:
            filemode.write_by_rename(self.directory / "finished.json", "{}\n")

    def finished(self) -> bool:
        return (self.directory / "finished.json").exists()

    def done(self, worker: int) -> None:
        pass  # the directory stays: worker 0 waits for no one

    def gone(self) -> str | None:
        return None  # a directory does not die; worker 0's heartbeat says whether it did

    def close(self) -> None:
        pass


def _read_arrivals(where: Path) -> dict[int, Arrival]:
    arrived: dict[int, Arrival] = {}
    for path in where.glob("worker-*.json"):
        try:
            data = json.loads(filemode.read_shared(path, what="arrival record"))
            arrival = Arrival(**data)
        except (OSError, ValueError, TypeError):
            continue  # written by rename: a file that does not parse is not ours
        arrived[arrival.worker] = arrival
    return arrived


def _create(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text`` unless it exists (``O_EXCL``: one creator wins).
    A claim is judged by its name only, so a reader never needs its content whole (the
    writer lease, whose content is read, is ``xla_host.slice``'s)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return True
