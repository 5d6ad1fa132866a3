"""Recalibration figures of a gate run: memory, and where a restart spends its time.

After a stack change a training team compares what a run needed with what the last bundle
needed. The restart check's children (``child_workload.py --mode train``) report, and
these pure functions turn into the check's figures (kept by the receipt):

Memory, per run and for the check:

* ``host_peak_rss_bytes``: the child's peak resident set, ``getrusage(RUSAGE_SELF)
  .ru_maxrss`` read by the child at the end of its workload (import included). The
  check keeps the largest of its runs.
* ``device_memory``: per device, ``bytes_used``, ``bytes_limit`` and ``peak_bytes_used``
  as the PJRT client's allocator statistics give them (the TPU HBM query; under SPMD
  through patch 0002's per-device binding), read after the last step of the cold run.
  XLA:CPU keeps no allocator statistics: the device says "not reported" and why.

The restart broken down (seconds; from the end of the import to the run being ready:
the end of the last step that brought a new graph, compiled or loaded; the steps after it,
the steady state, bring none, which the child checks against the workload's
``warmup_steps``. An optimizer that creates its state on the first step, Adam or AdamW,
makes the second step a second graph: time-to-ready covers both):

==================  ==========================================================================
phase               how it is measured
==================  ==========================================================================
import              timestamps around ``import torch, torch_xla`` in the child (not part of
                    time-to-ready)
setup               everything outside the warm-up's steps: the model built and moved to the
                    device, each step's inputs made (``ready_s`` minus the steps' spans)
trace               forward, backward and optimizer step traced into the lazy graph, summed
                    over the warm-up steps (timestamps from each step's start to its sync)
compile             XLA compilation inside the warm-up's syncs: torch_xla's ``CompileTime``
                    metric read before and after each sync
executable load     reading and deserializing cached executables inside those syncs: the
                    ``PersistentCacheLoad`` timer (``runtime/cache.h``), read the same way
                    (None on builds without it, and where no executable was loaded)
hash and lookup     the rest of the syncs: graph hashing, lowering to HLO (on a miss), the
                    cache lookup, queueing the execution (sync wall time minus compile and
                    executable load)
first execution     from each warm-up sync's return until its loss is on the host
==================  ==========================================================================

The parts add up: setup + trace + compile + executable load + hash and lookup + execute
is the run's ``ready_s`` (import aside), and no part is clamped: each metric is read
around the sync that contains it, so compile and load never exceed the sync they are part
of (a negative hash-and-lookup would be a measuring error and shows as one). ``graphs`` is
how many graphs the warm-up brought (the receipt keeps it per run). The executable-load
floor is what a warm restart cannot avoid however good its cache: reading the executables
(``load_floor_s``). ``above_floor_s`` is how much longer the warm time-to-ready is than
that floor, so a restart that spends most of its time elsewhere (tracing, hashing,
execution) shows where.

A report from before the child measured the warm-up (only ``first_step``) is broken down
from its first step with the run's metric sums, as it was then.
"""

from __future__ import annotations

import statistics
from typing import Any

PHASES = ("import", "setup", "trace", "compile", "executable_load", "hash_and_lookup", "execute")
NOT_REPORTED = "not reported"


def run_breakdown(report: dict[str, Any]) -> dict[str, float | None]:
    """One child's restart phases (seconds), from ``child_workload.py``'s train report."""
    ready = report.get("ready") or {}
    if ready:
        sync_s = float(ready["sync_s"])
        compile_s = float(ready["compile_s"])
        load_s = float(ready["load_s"]) if ready.get("load_s") is not None else None
        setup_s, trace_s, execute_s = (float(ready[k]) for k in ("setup_s", "trace_s", "execute_s"))
    else:
        first = report.get("first_step") or {}
        if not first:
            return {}
        sync_s = float(first["sync_s"])
        compile_s = float(report.get("compile_time_s") or 0.0)
        load = report.get("cache_load_time_s")
        load_s = float(load) if isinstance(load, int | float) else None
        setup_s, trace_s, execute_s = (float(first[k]) for k in ("setup_s", "trace_s", "execute_s"))
    return {
        "import": float(report.get("import_s", 0.0)),
        "setup": setup_s,
        "trace": trace_s,
        "compile": compile_s,
        "executable_load": load_s,
        # Not clamped: the sync holds its compile and load, so a negative rest would be a
        # measuring error, and it must show as one.
        "hash_and_lookup": sync_s - compile_s - (load_s or 0.0),
        "execute": execute_s,
    }


def run_memory(report: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    if isinstance(report.get("host_peak_rss_bytes"), int):
        figures["host_peak_rss_bytes"] = report["host_peak_rss_bytes"]
    if isinstance(report.get("device_memory"), dict):
        figures["device_memory"] = report["device_memory"]
    return figures


def _median_phases(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    breakdowns = [row["breakdown"] for row in rows if row.get("ok") and row.get("breakdown")]
    if not breakdowns:
        return {}
    phases: dict[str, float | None] = {}
    for phase in PHASES:
        values = [b[phase] for b in breakdowns if b.get(phase) is not None]
        phases[phase] = round(statistics.median(values), 4) if values else None
    return phases


def restart_figures(cold: list[dict[str, Any]], warm: list[dict[str, Any]]) -> dict[str, Any]:
    """The restart check's recalibration figures from its runs' rows (``restart.summarize``)."""
    finished = [row for row in [*cold, *warm] if row.get("ok")]
    peaks = [int(row["host_peak_rss_bytes"]) for row in finished if "host_peak_rss_bytes" in row]
    devices: dict[str, Any] = next(
        (row["device_memory"] for row in cold if row.get("ok") and "device_memory" in row), {}
    )
    # Peak bytes per device, or None when no device reports its memory.
    reported = {
        device: int(info.get("peak_bytes_used", info.get("bytes_used", 0)))
        for device, info in devices.items()
        if "not_reported" not in info
    } or None
    memory: dict[str, Any] = {
        "host_peak_rss_bytes": max(peaks) if peaks else None,
        "device_peak_bytes": reported,
        "devices": devices,
    }
    if reported is None:
        reasons = {str(info.get("not_reported")) for info in devices.values()} or {"no answer"}
        memory["device_peak_bytes"] = f"{NOT_REPORTED}: {'; '.join(sorted(reasons))}"
    breakdown = {"cold": _median_phases(cold), "warm": _median_phases(warm)}
    figures: dict[str, Any] = {"memory": memory, "breakdown": breakdown}
    # How many graphs time-to-ready covers (the warm-up's), and in how many steps.
    for phase, rows in (("cold", cold), ("warm", warm)):
        graphs = [int(r["ready_graphs"]) for r in rows if r.get("ok") and "ready_graphs" in r]
        steps = [int(r["ready_steps"]) for r in rows if r.get("ok") and "ready_steps" in r]
        if graphs:
            figures[f"{phase}_ready_graphs"] = max(graphs)
            figures[f"{phase}_ready_steps"] = max(steps)
    warm_ready = [float(row["ready_s"]) for row in warm if row.get("ok") and "ready_s" in row]
    load = breakdown["warm"].get("executable_load")
    if warm_ready:
        ready = statistics.median(warm_ready)
        floor: dict[str, Any] = {"warm_ready_s": round(ready, 4), "load_floor_s": load}
        if load is None:
            floor.update(above_floor_s=None, why="this build has no PersistentCacheLoad timer")
        else:
            floor["above_floor_s"] = round(ready - load, 4)
        figures["load_floor"] = floor
    return figures


def _mib(value: int) -> str:
    return f"{value / 1024**2:.0f} MiB"


def notes(figures: dict[str, Any]) -> list[str]:
    """One line for memory and one for the warm restart against its floor, for the report."""
    lines: list[str] = []
    memory = figures.get("memory") or {}
    host = memory.get("host_peak_rss_bytes")
    device = memory.get("device_peak_bytes")
    if host is not None:
        shown = (
            ", ".join(f"{name} {_mib(peak)}" for name, peak in device.items())
            if isinstance(device, dict)
            else str(device)
        )
        lines.append(f"memory: host peak {_mib(host)}; device peak: {shown}")
    floor = figures.get("load_floor") or {}
    if floor.get("load_floor_s") is not None:
        lines.append(
            f"warm time-to-ready {floor['warm_ready_s']:.3f}s, of which executable load "
            f"{floor['load_floor_s']:.3f}s (the floor); {floor['above_floor_s']:.3f}s above it"
        )
    if "warm_ready_graphs" in figures:
        lines.append(
            f"time-to-ready covers {figures['warm_ready_graphs']} graph(s) in "
            f"{figures['warm_ready_steps']} warm-up step(s), up to the steady state"
        )
    warm = (figures.get("breakdown") or {}).get("warm") or {}
    if warm:
        phases = ", ".join(f"{k} {v:.3f}s" for k, v in warm.items() if v is not None)
        lines.append(f"warm restart phases (median): {phases}")
    return lines
