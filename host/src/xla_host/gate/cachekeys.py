"""Key safety and same numbers: a cache that loads must never load the wrong executable.

Two verdicts from one set of fresh processes sharing a cold run:

``cache-key``: after a cold run fills the cache, each warm variant runs on its own copy
of that cache with one setting changed. A setting that shapes the executable must miss
and compile (``XLA_FLAGS=--xla_cpu_enable_fast_math=true`` on CPU; a changed
``torch_xla.set_custom_compile_options`` entry on builds that have it, which stock
torch_xla leaves out of the key: patch 0003); a setting that must not matter must still
hit (``XLA_FLAGS=--xla_dump_to=DIR``, and nothing changed at all). A variant that cannot
run on a build is reported "not applicable" with the reason, never as a pass.

``same-numbers``: the warm runs that loaded the cold run's executables give its losses
bit for bit (``float.hex``), and under SPMD a sharded output (upstream
test_persistent_cache.py's spmd_sharded case) keeps its bytes and its sharding spec
(``torch_xla._XLAC._get_xla_sharding_spec``) after a cache hit.

The verdicts (``judge_cache_key``, ``judge_same_numbers``) are pure functions of the
children's rows.

When the restart check runs in the same gate, its cold run and its first warm run serve
as the cold run and ``warm-same`` here (``SharedRuns``): the same workload, environment
and cache state (nothing changed, the cache as the cold run left it, no other loader
before it), so they prove the same thing; the rows say where they come from
(``same_run_as``).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from xla_host import log
from xla_host.gate import restart
from xla_host.gate import workload as workloads
from xla_host.gate.check import Declared, GateRun
from xla_host.gate.children import ChildSpec, run_child, run_side_by_side, runtime_env
from xla_host.gate.restart import same_losses, snapshot, summarize
from xla_host.gate.result import CheckResult
from xla_host.gate.target import Target
from xla_host.launch_profile import flag_name, flag_tokens

KEY_NAME = "cache-key"
NUMBERS_NAME = "same-numbers"
NAMES = (KEY_NAME, NUMBERS_NAME)
#: An XLA debug option that changes the code XLA:CPU emits (and its numerics).
FAST_MATH = "xla_cpu_enable_fast_math"
SHARDED_CPU_DEVICES = 4

HIT = "hit"
MISS = "miss"


@dataclass(frozen=True)
class Variant:
    """One warm run with one setting changed, and what the cache must do about it."""

    name: str
    setting: str
    expect: str  # HIT or MISS
    xla_flags: tuple[str, ...] = ()
    custom_options: tuple[tuple[str, str], ...] = ()
    #: Devices it applies to; () = every device.
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class SharedRuns:
    """The restart check's runs that stand for the cache checks' own (see the module doc)."""

    #: The restart check's cold-1 row (``restart.summarize``).
    cold: dict[str, Any]
    #: A copy of the cache directory as that cold run left it.
    cold_cache: Path
    #: The restart check's warm-1 row, standing for warm-same; None if it did not run.
    warm_same: dict[str, Any] | None


def shared_runs(runs: list[dict[str, Any]], cold_cache: Path) -> SharedRuns | None:
    """The cold-1 and warm-1 rows of a finished restart check, or None without a cold run."""
    by_name = {row["name"]: row for row in runs}
    if "cold-1" not in by_name or not cold_cache.is_dir():
        return None
    return SharedRuns(by_name["cold-1"], cold_cache, by_name.get("warm-1"))


def _as(row: dict[str, Any], name: str) -> dict[str, Any]:
    return {**row, "name": name, "same_run_as": f"restart: {row['name']}"}


def variants(dump_dir: Path) -> list[Variant]:
    return [
        Variant("warm-same", "nothing changed", HIT),
        Variant(
            "warm-dump", f"XLA_FLAGS=--xla_dump_to={dump_dir}", HIT, (f"--xla_dump_to={dump_dir}",)
        ),
        Variant(
            "warm-fast-math",
            f"XLA_FLAGS=--{FAST_MATH}=true",
            MISS,
            (f"--{FAST_MATH}=true",),
            devices=("CPU",),
        ),
        Variant(
            "warm-custom-option",
            f"torch_xla.set_custom_compile_options({{'{FAST_MATH}': 'true'}})",
            MISS,
            custom_options=((FAST_MATH, "true"),),
        ),
    ]


def not_applicable(variant: Variant, device: str, cold: Mapping[str, Any]) -> str | None:
    """Why ``variant`` cannot run on this build/device, or None if it can."""
    if variant.devices and device not in variant.devices:
        return f"{variant.setting} is an XLA:CPU option; it says nothing about {device} executables"
    if variant.custom_options and not cold.get("has_set_custom_compile_options", False):
        return "this build has no torch_xla.set_custom_compile_options (added after 2.9.0)"
    return None


def judge_cache_key(
    cold: dict[str, Any], runs: list[tuple[Variant, dict[str, Any] | None, str | None]]
) -> CheckResult:
    """``runs``: (variant, its row or None, why not applicable or None)."""
    reasons: list[str] = []
    table: list[dict[str, Any]] = []
    if not cold["ok"]:
        return CheckResult(KEY_NAME, False, [f"{cold['name']} did not finish: {cold['error']}"])
    expected = cold["misses"]
    if expected == 0:
        reasons.append("the cold run had no persistent-cache misses: nothing was compiled to cache")
    for variant, row, why_not in runs:
        entry: dict[str, Any] = {"variant": variant.name, "setting": variant.setting}
        entry["expect"] = variant.expect
        if why_not is not None:
            # Shown as its own line of the report (figures["variants"]), never as a pass.
            entry.update({"status": "not applicable", "reason": why_not})
            table.append(entry)
            continue
        assert row is not None
        problems = _variant_problems(variant, row, expected)
        entry.update(
            {
                "status": "fail" if problems else "pass",
                "hits": row.get("hits"),
                "misses": row.get("misses"),
                "xla_compiles": row.get("xla_compiles"),
            }
        )
        table.append(entry)
        reasons += [f"{variant.name} ({variant.setting}): {p}" for p in problems]
    figures = {"cold_misses": expected, "variants": table}
    return CheckResult(KEY_NAME, not reasons, reasons, figures=figures)


def _variant_problems(variant: Variant, row: dict[str, Any], expected: int) -> list[str]:
    if not row["ok"]:
        return [f"did not finish: {row['error']}"]
    if variant.expect == HIT:
        problems = []
        if row["hits"] != expected or row["deserialize_failures"]:
            problems.append(
                f"must hit the cache but loaded {row['hits']} of {expected} "
                f"({row['deserialize_failures']} deserialize failure(s))"
            )
        if row["xla_compiles"]:
            problems.append(f"must not compile but compiled {row['xla_compiles']} time(s)")
        return problems
    if row["hits"] or not row["xla_compiles"] or not row["misses"]:
        return [
            f"must miss and compile but had {row['hits']} hit(s), {row['misses']} miss(es), "
            f"{row['xla_compiles']} compile(s): the cache key ignores a setting that shapes "
            "the executable, so a restart with it would run the old executable"
        ]
    return []


def judge_same_numbers(
    cold: dict[str, Any],
    loaders: list[dict[str, Any]],
    sharded_cold: dict[str, Any] | None,
    sharded_warm: dict[str, Any] | None,
) -> CheckResult:
    """Losses of runs that loaded the cold run's executables, and the sharded case."""
    reasons: list[str] = []
    notes: list[str] = []
    figures: dict[str, Any] = {}
    if not cold["ok"]:
        return CheckResult(NUMBERS_NAME, False, [f"{cold['name']} did not finish: {cold['error']}"])
    loaded = [row for row in loaders if row["ok"] and row["hits"] and not row["xla_compiles"]]
    recompiled = [row["name"] for row in loaders if row["ok"] and row not in loaded]
    if not loaded:
        reasons.append(
            "no warm run loaded the cold run's executables: there is nothing cached to compare"
        )
    reasons += same_losses([cold, *loaded])
    figures["compared"] = [row["name"] for row in loaded]
    figures["cold_loss_hex"] = cold.get("loss_hex")
    if recompiled:
        notes.append(f"not compared (they recompiled, so they prove nothing): {recompiled}")
    if sharded_cold is None:
        notes.append("sharded output: not run")
    elif sharded_warm is None:
        reasons.append(f"{sharded_cold['name']} did not finish: {sharded_cold.get('error')}")
    else:
        reasons += _sharded_problems(sharded_cold, sharded_warm)
        figures["sharding_spec"] = sharded_cold.get("output_sharding_spec")
        figures["sharded_hits"] = sharded_warm.get("hits")
    return CheckResult(NUMBERS_NAME, not reasons, reasons, notes, figures)


def _sharded_problems(cold: dict[str, Any], warm: dict[str, Any]) -> list[str]:
    broken = [row for row in (cold, warm) if not row["ok"]]
    if broken:
        return [f"{row['name']} did not finish: {row['error']}" for row in broken]
    problems = []
    if not cold.get("output_correct") or not warm.get("output_correct"):
        problems.append("the sharded t + t is not 2t")
    if not cold.get("output_sharding_spec"):
        problems.append(f"{cold['name']}: the output carries no sharding spec")
    # Not judged on compiles: measured on 2.7.0, a compile outside the persistent cache
    # (CompileTime without a PersistentCacheMiss) happens on the warm run too.
    if warm["hits"] < 1 or warm["hits"] != cold["misses"] or warm["deserialize_failures"]:
        problems.append(
            f"{warm['name']}: the sharded computation was not loaded from the cache "
            f"({warm['hits']} hit(s) for {cold['misses']} cold miss(es), "
            f"{warm['deserialize_failures']} deserialize failure(s)), so its spec is unproven"
        )
    if warm.get("output_sharding_spec") != cold.get("output_sharding_spec"):
        problems.append(
            f"{warm['name']}: output sharding spec {warm.get('output_sharding_spec')!r} after the "
            f"cache hit, {cold.get('output_sharding_spec')!r} when compiled"
        )
    if warm.get("output_hex") != cold.get("output_hex"):
        problems.append(f"{warm['name']}: the sharded output differs from the compiled run's")
    return problems


def _with_flags(env: dict[str, str], flags: tuple[str, ...]) -> dict[str, str]:
    if flags:
        # Flags the caller (or the launch profile) set stay in force, except one of the
        # same name, which the variant's replaces: a flag given twice is XLA's parser's
        # choice, not the check's.
        names = {flag_name(flag) for flag in flags}
        kept = [t for t in flag_tokens(env.get("XLA_FLAGS", "")) if flag_name(t) not in names]
        env = {**env, "XLA_FLAGS": " ".join([*kept, *flags])}
    return env


def against(variant: Variant, env: Mapping[str, str]) -> Variant:
    """The variant changed so that it still changes something under ``env``.

    Under a launch profile whose XLA_FLAGS already set a variant's boolean flag to the
    variant's value (``--xla_cpu_enable_fast_math=true``), the variant flips it instead:
    the setting must differ from the cold run's to test the key. XLA's default for that
    flag is false (torch_xla's __init__ even writes ``=false`` when it is missing), so
    the flipped variant misses only if the cold run really compiled under the profile's
    flag: a profile flag that did not reach the children turns the check's verdict.
    """
    present = {flag_name(t): t for t in flag_tokens(env.get("XLA_FLAGS", ""))}
    flipped = []
    for flag in variant.xla_flags:
        name, _, value = flag.partition("=")
        if present.get(name) == flag and value in ("true", "false"):
            flag = f"{name}={'false' if value == 'true' else 'true'}"
        flipped.append(flag)
    if tuple(flipped) == variant.xla_flags:
        return variant
    setting = f"XLA_FLAGS={' '.join(flipped)} (the environment sets {' '.join(variant.xla_flags)})"
    return replace(variant, setting=setting, xla_flags=tuple(flipped))


def run_cache_checks(
    target: Target,
    runs_dir: Path,
    scratch: Path,
    *,
    checks: tuple[str, ...] = NAMES,
    workload: workloads.WorkloadSpec = workloads.DEFAULT,
    timeout_s: float = 600.0,
    shared: SharedRuns | None = None,
) -> list[CheckResult]:
    """Run the children both verdicts need (once) and judge the selected ones.

    ``shared``: the restart check's cold and first warm run of the same ``workload``,
    used instead of running them again.
    """
    began = time.monotonic()
    runs = runs_dir / "cache-checks"
    train = ["--mode", "train", *workload.child_args()]

    def child(name: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
        with log.section(f"cache checks: {name}"):
            return summarize(run_child(target.python, name, runs, args, env, timeout_s))

    if shared is not None:
        cache = shared.cold_cache
        cold = _as(shared.cold, "cold")
    else:
        cache = scratch / "cache-checks" / "cold"
        cache.mkdir(parents=True)
        cold = child("cold", train, runtime_env(target.device, cache_dir=cache))
        workloads.refuse_unjudgeable(workload.name, [cold])
    after_cold = snapshot(cache)
    done, to_run = _variant_runs(target, runs, scratch, checks, cache, cold, train, shared)
    sharded_env: dict[str, str] | None = None
    if NUMBERS_NAME in checks and cold["ok"]:
        sharded_cache = scratch / "cache-checks" / "sharded"
        sharded_cache.mkdir()
        sharded_env = runtime_env(
            target.device, cache_dir=sharded_cache, cpu_devices=SHARDED_CPU_DEVICES
        )
    # Side by side: these are judged by counters, losses and outputs, never by time, and
    # each has its own cache directory.
    specs = [spec for _, spec in to_run]
    if sharded_env is not None:
        specs.append(ChildSpec("sharded-cold", ["--mode", "sharded"], sharded_env))
    with log.section(f"cache checks: {', '.join(spec.name for spec in specs) or 'nothing to run'}"):
        finished = run_side_by_side(target.python, runs, specs, timeout_s, device=target.device)
    for (slot, _), child_result in zip(to_run, finished, strict=False):
        done[slot] = (done[slot][0], summarize(child_result), None)
    results: list[CheckResult] = []
    if KEY_NAME in checks:
        result = judge_cache_key(cold, done)
        result.figures["cache_files_after_cold"] = len(after_cold)
        result.runs = [cold, *(row for _, row, _ in done if row is not None)]
        results.append(result)
    if NUMBERS_NAME in checks:
        loaders = [row for v, row, _ in done if row is not None and v.expect == HIT]
        sharded_cold = sharded_warm = None
        if sharded_env is not None:
            sharded_cold = summarize(finished[-1])
            if sharded_cold["ok"]:
                sharded_warm = child("sharded-warm", ["--mode", "sharded"], sharded_env)
        result = judge_same_numbers(cold, loaders, sharded_cold, sharded_warm)
        result.runs = [cold, *loaders, *(r for r in (sharded_cold, sharded_warm) if r)]
        results.append(result)
    for result in results:
        result.duration_s = time.monotonic() - began
    return results


def _variant_runs(
    target: Target,
    runs: Path,
    scratch: Path,
    checks: tuple[str, ...],
    cache: Path,
    cold: dict[str, Any],
    train: list[str],
    shared: SharedRuns | None,
) -> tuple[list[tuple[Variant, dict[str, Any] | None, str | None]], list[tuple[int, ChildSpec]]]:
    """Each wanted variant with its run so far (a shared run, or why it does not apply),
    and the children still to run, by their slot in that list; each such child gets its
    own copy of the cold cache."""
    done: list[tuple[Variant, dict[str, Any] | None, str | None]] = []
    to_run: list[tuple[int, ChildSpec]] = []
    wanted = [v for v in variants(runs / "xla-dump") if KEY_NAME in checks or v.expect == HIT]
    for variant in wanted:
        why_not = not_applicable(variant, target.device, cold)
        if why_not is not None or not cold["ok"]:
            done.append((variant, None, why_not or "the cold run did not finish"))
            continue
        if variant.name == "warm-same" and shared is not None and shared.warm_same is not None:
            done.append((variant, _as(shared.warm_same, variant.name), None))
            continue
        # Each variant gets its own copy of the cold cache: what one variant writes
        # (a miss stores a new entry) must not decide another's outcome.
        copy = scratch / "cache-checks" / variant.name
        shutil.copytree(cache, copy)
        base = runtime_env(target.device, cache_dir=copy)
        variant = against(variant, base)  # the variant as run is what the verdict records
        env = _with_flags(base, variant.xla_flags)
        args = [*train, *(f"--custom-compile-option={k}={v}" for k, v in variant.custom_options)]
        to_run.append((len(done), ChildSpec(variant.name, args, env)))
        done.append((variant, None, None))
    return done, to_run


# --- as the gate's registry lists them (xla_host.gate.checks) ---------------------------


def _judge_alone(run: GateRun, names: tuple[str, ...]) -> list[CheckResult]:
    return run_cache_checks(
        run.target, run.runs_dir, run.scratch, checks=names, workload=run.config.workload,
        timeout_s=run.timeout_s,
    )  # fmt: skip


def _judge_from_restart(
    run: GateRun, names: tuple[str, ...], first: CheckResult
) -> list[CheckResult]:
    return run_cache_checks(
        run.target, run.runs_dir, run.scratch, checks=names, workload=run.config.workload,
        timeout_s=run.timeout_s, shared=shared_runs(first.runs, run.kept_cold_cache),
    )  # fmt: skip


def _shares_cold(run: GateRun) -> bool:
    """The restart check's cold and first warm run are these checks' when they are the same
    runs: one single-device writer (not on a slice's reader, whose cold run is read-only
    and finds the writer's cache)."""
    return not run.config.spmd and run.config.writers == 1 and run.role == "writer"


CHECK = Declared(
    names=NAMES,
    child_runs=("train", "sharded"),
    judge=_judge_alone,
    shares=restart.NAME,
    sharing=_shares_cold,
    judge_from=_judge_from_restart,
)
