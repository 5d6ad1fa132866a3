"""The restart benchmark: cold and warm time-to-first-step over several restarts.

A benchmark, not a test: it measures and reports, it does not judge. Each round runs an
import-only child (the floor no cache can beat), a cold child on a fresh empty cache
directory and a warm child on the directory the first cold child filled. Medians and
spread (min, max, relative spread) go to a table on stdout and to JSON.

Next to the warm time-to-ready it reports the executable-load time: the
``PersistentCacheLoad`` metric (torch_xla's runtime/cache.h times reading and
deserializing each entry), summed per warm run, where the build has it. The figure then
reads as "how close is a warm restart to just loading the executables". The ``medium``
workload makes compilation dominate on CPU (seconds), so the ratio is less noisy than with
``small``, which compiles in half a second.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from xla_host import log
from xla_host.gate import workload as workloads
from xla_host.gate.children import run_child, runtime_env
from xla_host.gate.errors import GateEnvironmentError
from xla_host.gate.report import format_table
from xla_host.gate.target import Target

BENCH_JSON = "restart.json"


def spread(values: list[float]) -> dict[str, float]:
    median = statistics.median(values)
    return {
        "median": round(median, 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "rel_spread": round((max(values) - min(values)) / median, 3) if median else 0.0,
        "n": len(values),
    }


def run_bench(
    target: Target,
    workdir: Path,
    rounds: int,
    workload: workloads.WorkloadSpec,
    timeout_s: float,
    *,
    caches: Path | None = None,
) -> dict[str, Any]:
    """The benchmark's rounds: the children's logs and reports in ``workdir`` (kept: an
    error names them), their compilation caches under ``caches`` (default ``workdir``;
    scratch, fresh each run, so that a cold run really compiles)."""
    caches = workdir if caches is None else caches
    train = ["--mode", "train", *workload.child_args()]
    plain_env = runtime_env(target.device)
    warm_cache = caches / "cache-warm"
    samples: dict[str, list[dict[str, Any]]] = {
        "import": [],
        "cold": [],
        "warm": [],
        "lowering": [],
    }

    def sample(phase: str, name: str, args: list[str], env: dict[str, str]) -> None:
        result = run_child(target.python, name, workdir, args, env, timeout_s)
        problem = (result.report or {}).get("workload_problem")
        if problem:
            raise workloads.unjudgeable(workload.name, str(problem), result.log_path)
        if not result.ok or result.report is None:
            raise GateEnvironmentError(
                f"benchmark child failed: {result.failure()}\n{result.log_tail(10)}",
                fix="run `make gate` with the same PYTHON first to see what is wrong",
            )
        samples[phase].append(result.report)

    for i in range(rounds):
        with log.section(f"bench round {i + 1}/{rounds}"):
            sample("import", f"import-{i}", ["--mode", "import"], plain_env)
            # Round 0's cold run fills the cache every warm run reads; later cold runs get
            # a fresh directory each, so every cold sample really compiles.
            cold_cache = warm_cache if i == 0 else caches / f"cache-cold-{i}"
            cold_cache.mkdir(parents=True, exist_ok=True)
            sample("cold", f"cold-{i}", train, runtime_env(target.device, cache_dir=cold_cache))
            sample("warm", f"warm-{i}", train, runtime_env(target.device, cache_dir=warm_cache))
    with log.section("bench: lowering and fingerprint per graph"):
        sample("lowering", "lowering", [*train, "--lowering-cost"], plain_env)
    summary: dict[str, Any] = {
        "target": {
            "torch_xla": target.torch_xla_version,
            "torch": target.torch_version,
            "device": target.device,
        },
        "workload": workload.name,
        "rounds": rounds,
        "import_s": spread([s["import_s"] for s in samples["import"]]),
    }
    for phase in ("cold", "warm"):
        reports = samples[phase]
        summary[phase] = {
            "time_to_first_step_s": spread([r["time_to_first_step_s"] for r in reports]),
            "ready_s": spread([r["ready_s"] for r in reports]),
            "steady_step_s": spread([r["steady_step_s"] for r in reports]),
            "xla_compiles": [r["xla_compiles"] for r in reports],
            "cache_hits": [r["counters"]["PersistentCacheHit"] for r in reports],
            "compile_time_s": spread([float(r.get("compile_time_s", 0.0)) for r in reports]),
            "deserialize_failures": [
                r["counters"]["PersistentCacheDeserializeFailure"] for r in reports
            ],
        }
    loads = [r.get("cache_load_time_s") for r in samples["warm"]]
    # None: this build has no PersistentCacheLoad metric (or loaded nothing).
    present = [float(v) for v in loads if v is not None]
    summary["warm"]["load_s"] = spread(present) if len(present) == len(loads) else None
    cold, warm = summary["cold"], summary["warm"]
    summary["ratio_time_to_first_step"] = round(
        warm["time_to_first_step_s"]["median"] / cold["time_to_first_step_s"]["median"], 3
    )
    summary["ratio_ready"] = round(warm["ready_s"]["median"] / cold["ready_s"]["median"], 3)
    summary["lowering"] = lowering_figures(samples["lowering"][0], warm["ready_s"]["median"])
    return summary


def lowering_figures(report: dict[str, Any], warm_ready_s: float) -> dict[str, Any]:
    """The module key's cost: per graph the warm-up steps compile (a step whose sync
    missed the in-memory cache), lowering to HLO plus the canonical fingerprint, and their
    sum against warm ready."""
    graphs: list[dict[str, Any]] = []
    for row in report.get("lowering", []):
        if not row.get("new_graph"):
            continue  # the in-memory cache had it: no disk key is taken
        graphs.append(
            {
                "step": row["step"],
                "module": row["module"],
                "hlo_chars": row["hlo_chars"],
                "lower_s": round(row["lower_s"], 5),
                "fingerprint_s": round(row["fingerprint_s"], 5),
            }
        )
    total = sum(g["lower_s"] + g["fingerprint_s"] for g in graphs)
    return {
        "graphs": graphs,
        "total_s": round(total, 5),
        "share_of_warm_ready": round(total / warm_ready_s, 4) if warm_ready_s else None,
    }


def render_bench(summary: dict[str, Any]) -> str:
    def row(label: str, stats: dict[str, float]) -> list[str]:
        return [
            label,
            f"{stats['median']:.3f}",
            f"{stats['min']:.3f}",
            f"{stats['max']:.3f}",
            f"{stats['rel_spread']:.0%}",
        ]

    rows = [row("import only (floor)", summary["import_s"])]
    for phase in ("cold", "warm"):
        rows.append(row(f"{phase}: time to first step", summary[phase]["time_to_first_step_s"]))
        rows.append(row(f"{phase}: ready (excl. import)", summary[phase]["ready_s"]))
        if phase == "cold" and "compile_time_s" in summary["cold"]:
            rows.append(row("cold: XLA compile (within ready)", summary["cold"]["compile_time_s"]))
        if phase == "warm" and summary["warm"].get("load_s") is not None:
            rows.append(row("warm: executable load (within ready)", summary["warm"]["load_s"]))
        rows.append(row(f"{phase}: steady step", summary[phase]["steady_step_s"]))
    target = summary["target"]
    head = (
        f"restart benchmark: torch_xla {target['torch_xla']} (torch {target['torch']}) on "
        f"{target['device']}, workload {summary['workload']}, {summary['rounds']} rounds"
    )
    table = format_table(["seconds", "median", "min", "max", "spread"], rows)
    tail = [
        f"warm/cold time to first step (medians): {summary['ratio_time_to_first_step']:.2f}",
        f"warm/cold ready excl. import (medians): {summary['ratio_ready']:.2f}",
        f"XLA compiles cold {summary['cold']['xla_compiles']} "
        f"warm {summary['warm']['xla_compiles']}; "
        f"warm cache hits {summary['warm']['cache_hits']}, "
        f"deserialize failures {summary['warm']['deserialize_failures']}",
        _load_line(summary),
        *_lowering_lines(summary),
    ]
    return "\n".join(["", head, "", table, "", *tail, ""])


def _load_line(summary: dict[str, Any]) -> str:
    load = summary["warm"].get("load_s")  # absent from benchmarks kept before it existed
    if load is None:
        return "executable load time: not reported (no PersistentCacheLoad metric in this build)"
    ready = summary["warm"]["ready_s"]["median"]
    share = load["median"] / ready if ready else 0.0
    return (
        f"warm ready {ready:.2f}s of which executable load {load['median']:.2f}s "
        f"({share:.0%}); the rest is tracing, transfers and the first step"
    )


def _lowering_lines(summary: dict[str, Any]) -> list[str]:
    lowering = summary.get("lowering")  # absent from benchmarks kept before it existed
    if not lowering:
        return []
    lines = [
        f"graph of step {g['step']}: lowering {g['lower_s'] * 1000:.1f} ms + fingerprint "
        f"{g['fingerprint_s'] * 1000:.1f} ms ({g['hlo_chars']} chars of HLO)"
        for g in lowering["graphs"]
    ]
    share = lowering["share_of_warm_ready"]
    lines.append(
        f"keying on the lowered module: {lowering['total_s'] * 1000:.1f} ms per start"
        + (f", {share:.1%} of warm ready" if share is not None else "")
        + " (Python text fingerprint: an upper bound of the C++ key's cost)"
    )
    return lines


def write_bench(out_dir: Path, summary: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / BENCH_JSON
    summary = {**summary, "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return path
