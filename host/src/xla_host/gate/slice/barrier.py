"""The barrier's verdict: whether a phase can start, from what one waiter has seen (every
worker's arrival and heartbeat, on the waiter's own clock). Pure: the transports
(``directory``, ``coordinator``) bring what is seen, ``membership`` asks the verdict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Arrival:
    """One worker's file at a phase."""

    worker: int
    host: str
    pid: int
    ok: bool
    reason: str = ""
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BeatSeen:
    """A worker's heartbeat as this waiter saw it: its value, and since when (monotonic)."""

    value: str
    since: float


@dataclass(frozen=True)
class BarrierVerdict:
    state: str
    """``done``, ``wait``, ``failed`` (a worker reported failure) or ``timed_out``."""
    missing: tuple[int, ...] = ()
    message: str = ""


def judge_barrier(
    phase: str,
    workers: int,
    arrived: Mapping[int, Arrival],
    beats: Mapping[int, BeatSeen],
    *,
    now: float,
    started: float,
    timeout_s: float,
    dead_after_s: float,
) -> BarrierVerdict:
    """Whether a phase can start: a pure verdict from what the waiter has seen."""
    failed = sorted((a for a in arrived.values() if not a.ok), key=lambda a: a.worker)
    if failed:
        named = "; ".join(f"worker {a.worker} ({a.host}): {a.reason}" for a in failed)
        return BarrierVerdict("failed", (), f"{phase}: {named}")
    missing = tuple(w for w in range(workers) if w not in arrived)
    if not missing:
        return BarrierVerdict("done")
    dead = [w for w in missing if w in beats and now - beats[w].since > dead_after_s]
    if dead:
        names = ", ".join(f"worker {w}" for w in dead)
        return BarrierVerdict(
            "timed_out",
            tuple(dead),
            f"{phase}: {names} stopped: no heartbeat for more than {dead_after_s:g}s "
            "(killed, or its host is gone)",
        )
    if now - started > timeout_s:
        names = ", ".join(
            f"worker {w}" + ("" if w in beats else " (never started)") for w in missing
        )
        return BarrierVerdict(
            "timed_out", missing, f"{phase}: {names} did not arrive within {timeout_s:g}s"
        )
    return BarrierVerdict("wait", missing)
