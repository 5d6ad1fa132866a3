"""One run of the gate: which checks share children, which chains run side by side.

The gate's entry point: :func:`run_gate` takes a :class:`GateConfig` (what ``xla-wheels
gate`` parsed) and returns a :class:`GateOutcome` (the target judged, each check's result,
the reports written); the CLI prints it and leaves the receipt. Standard library only,
like the whole gate (``tests/test_layers.py``).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from xla_host import cache_role, log
from xla_host import slice as leases
from xla_host.gate import checks as registry
from xla_host.gate import restart, under_profile, upstream_tests
from xla_host.gate import slice as slices
from xla_host.gate.check import GateConfig, GateRun
from xla_host.gate.children import run_in_parallel
from xla_host.gate.errors import GateEnvironmentError
from xla_host.gate.report import write_reports
from xla_host.gate.result import CheckResult
from xla_host.gate.target import Target, resolve_target

#: Every check's name, in the gate's order (the registry's).
CHECKS = registry.CHECKS


@dataclass(frozen=True)
class GateOutcome:
    """A finished gate run: its verdicts and where its reports are."""

    target: Target
    results: list[CheckResult]
    json_path: Path
    junit_path: Path
    slice_record: dict[str, Any] | None = None
    """Worker 0 of a slice: the receipt's record of it (``slices.merge_slice``)."""
    cold_cache: Path | None = None
    """With ``pack_dir``: a copy of the restart check's cold cache, in a temporary
    directory the caller removes (``xla_host.cache_pack.pack_gate_run``)."""


def side_by_side(config: GateConfig, target: Target) -> bool:
    """Whether the chains of children of ``config.checks`` run side by side.

    Only on CPU: a process that opens a TPU holds its chips. And not when the restart check
    records or is judged against a baseline: that is its one wall-time verdict, and a
    neighbour stretches wall time. Every other verdict stands on counters, outputs and CPU
    time, shown to hold beside a busy process (gate/README.md, "Under load").
    """
    checks = config.checks
    if target.device != "CPU":
        return False
    if config.xla_cache_dir is not None and {"restart", restart.SPMD_NAME} <= set(checks):
        # The SPMD variant's cache is a directory inside the given one, which the restart
        # check snapshots: they must not run at the same time.
        return False
    if "restart" in checks:
        path = restart.baseline_path(config.baselines_dir, target, config.workload.name)
        if config.record_baseline or path.exists():
            return False
    return True


def run_gate(config: GateConfig) -> GateOutcome:
    """Judge the environment with every check of ``config`` and write the reports
    (report.json, junit.xml); an environment that cannot be judged raises
    :class:`GateEnvironmentError` after its report is written."""
    settings = dict(config.settings)
    if config.profile is not None:
        settings["launch_profile"] = config.profile.record()
    scratch = Path(tempfile.mkdtemp(prefix="xla-gate-"))
    # Outside the scratch directory, which goes when the run ends: the pack is written
    # after the receipt, whose digest its manifest names.
    pack_keep = Path(tempfile.mkdtemp(prefix="xla-gate-pack-")) if config.pack_dir else None
    try:
        with under_profile.children_launched_under(config.profile), _roles(config) as roles:
            member, role = roles
            if member is None:
                outcome = _run(config, settings, scratch, role, None, pack_keep)
            else:
                try:
                    outcome = _run(config, settings, scratch, role, member, pack_keep)
                except BaseException as error:
                    # The other workers wait for this one at the next phase: tell them.
                    member.abort(getattr(error, "message", None) or type(error).__name__)
                    raise
        if pack_keep is not None and (pack_keep / "cache").is_dir():
            outcome = replace(outcome, cold_cache=pack_keep / "cache")
            pack_keep = None  # the caller's now
        return outcome
    finally:
        if pack_keep is not None:
            shutil.rmtree(pack_keep, ignore_errors=True)
        if config.keep_cache:
            log.info(f"kept the gate's scratch directory {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def _roles(config: GateConfig) -> Iterator[tuple[slices.Slice | None, str]]:
    """This run's place in its slice (if any) and its cache role: the one rule's writer
    (:attr:`GateConfig.cache_role`: a slice's worker 0, or a single host) with a given cache
    directory claims the directory's writer lease; held by another job, the run goes on
    read-only, as a reader does."""
    spec = config.slice
    decided = config.cache_role or cache_role.of_worker(spec.worker_id if spec else None)
    with contextlib.ExitStack() as stack:
        lease = None
        cache = config.xla_cache_dir
        if cache is not None and decided.writer:
            try:
                cache.mkdir(parents=True, exist_ok=True)
                lease = stack.enter_context(leases.writer_lease(cache, f"gate {config.out_dir}"))
            except OSError as error:
                raise GateEnvironmentError(
                    f"cache directory {cache} is not writable: {error}",
                    fix="pass a writable --xla-cache-dir (or none: the gate uses its own "
                    "temporary one)",
                ) from error
        role = leases.judged_role(decided, lease)
        if role == decided.role:
            log.info(f"gate: cache role {decided.describe()}")
        else:
            log.info(f"gate: cache role {role}, not {decided.describe()}: the lease is held")
        member = None
        if spec is not None and spec.workers > 1:
            member = stack.enter_context(slices.running(spec))
        yield member, role


def _run(
    config: GateConfig,
    settings: dict[str, Any],
    scratch: Path,
    role: str,
    member: slices.Slice | None,
    pack_keep: Path | None = None,
) -> GateOutcome:
    runs_dir, timeout_s = config.runs_dir, config.child_timeout_s
    if config.slice is not None:
        spec = config.slice
        settings["slice"] = {"worker": spec.worker_id, "workers": spec.workers, "role": role}
    try:
        python = config.python() if callable(config.python) else config.python
        target = resolve_target(
            python, config.device, workdir=runs_dir, timeout_s=timeout_s, workload=config.workload
        )
    except GateEnvironmentError as error:
        write_reports(config.out_dir, None, [], error=error.message, settings=settings)
        raise
    log.info(f"judging {target.label}")
    try:
        return _judge(config, settings, scratch, role, member, target, pack_keep)
    except slices.SliceError as error:
        # A slice that failed still leaves its reports, with why it could not go on in
        # them (report.json's error and exit code, junit's error), as any other error.
        write_reports(
            config.out_dir,
            target,
            [],
            error=error.message,
            settings=settings,
            exit_code=int(error.exit_code),
        )
        raise


def _judge(
    config: GateConfig,
    settings: dict[str, Any],
    scratch: Path,
    role: str,
    member: slices.Slice | None,
    target: Target,
    pack_keep: Path | None,
) -> GateOutcome:
    checks, runs_dir, timeout_s = config.checks, config.runs_dir, config.child_timeout_s
    upstream = (
        upstream_tests.prepare(config.upstream_tests, config.upstream_tests_revision)
        if config.upstream_tests is not None
        else None
    )
    # Independent chains of children, composed from the registry first, then run: side by
    # side on CPU (see side_by_side), one after the other on a TPU.
    run = GateRun(config, target, role, scratch, member, pack_keep)
    chains = registry.chains(run, checks)
    parallel = side_by_side(config, target)
    if len(chains) > 1:
        how = "side by side" if parallel else "one after the other"
        log.info(f"{len(chains)} chains of checks {how}")
    done = run_in_parallel(chains, side_by_side=parallel)
    results = sorted((r for chain in done for r in chain), key=lambda r: checks.index(r.name))
    if config.upstream_tests is not None:
        results.append(
            upstream_tests.run_upstream_test(
                target,
                config.upstream_tests,
                runs_dir,
                revision=config.upstream_tests_revision,
                timeout_s=max(timeout_s, 900.0),
                prepared=upstream,
            )
        )
    record = None
    if config.slice is not None:
        record = _merge_slice(config.slice, member, target, results)
        if record is not None:
            reasons = slices.slice_verdicts(record)
            figures = {k: v for k, v in record.items() if k != "workers"}
            note = (
                f"{record['hosts']} worker(s) on topology {record['topology']}: every worker's "
                "checks passed"
            )
            notes = [] if reasons else [note]
            results.append(CheckResult(SLICE_NAME, not reasons, reasons, notes, figures))
    json_path, junit_path = write_reports(config.out_dir, target, results, settings=settings)
    if member is not None:
        # Worker 0 has recorded the slice; the others end only once it says so (a worker
        # whose worker 0 died before that fails, never passes).
        member.finish()
    return GateOutcome(target, results, json_path, junit_path, record)


#: The row worker 0 adds: the other workers' verdicts (the slice passes when all do).
SLICE_NAME = "slice"


def _merge_slice(
    spec: slices.SliceSpec,
    member: slices.Slice | None,
    target: Target,
    results: list[CheckResult],
) -> dict[str, Any] | None:
    """Every worker posts its verdicts and addressable devices; worker 0 merges them into
    the receipt's record of the slice (the others return None)."""
    payload = {
        "addressable_devices": list(target.runtime_devices),
        "checks": [{"name": r.name, "passed": r.passed, "reasons": r.reasons} for r in results],
    }
    if member is None:
        me = slices.Arrival(spec.worker_id, socket.gethostname(), 0, True, "", payload)
        arrivals = {spec.worker_id: me}
    else:
        arrivals = member.join("results", payload=payload)
    if not spec.writer:
        log.info(f"slice: worker {spec.worker_id} posted its verdicts; worker 0 records them")
        return None
    if spec.accelerator_type is None and target.accelerator_type:
        spec = replace(spec, accelerator_type=target.accelerator_type)
    return slices.merge_slice(spec, target.device, arrivals)
