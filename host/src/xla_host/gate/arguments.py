"""The gate's arguments, defined once for both command lines.

The builder's ``xla-wheels gate`` (``xla_wheels.cli.gate``: the checkout's wheels.lock,
the cached stock environments) and the host's (``xla_host.cli``: the lane's bundle
document) add these to their parsers and compose the run's :class:`GateConfig` from them
with :func:`gate_config`; each adds only its own way of naming the bundle and the
interpreter.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from xla_host import slice as slices
from xla_host.arguments import OUTPUT_DIR, ValueType, amount, count
from xla_host.errors import UsageError
from xla_host.gate import restart, under_profile
from xla_host.gate import workload as workloads
from xla_host.gate.errors import GateEnvironmentError
from xla_host.gate.report import render_text
from xla_host.gate.result import ensure_passed
from xla_host.gate.run import CHECKS, GateConfig, GateOutcome, run_gate
from xla_host.gate.target import DEVICES


def checks(value: str) -> list[str]:
    """``--checks``: a comma-separated subset of :data:`CHECKS`, in their order."""
    chosen = [c.strip() for c in value.split(",") if c.strip()]
    unknown = sorted(set(chosen) - set(CHECKS))
    if unknown or not chosen:
        raise UsageError(
            f"unknown check(s) {', '.join(unknown) or '(none given)'}",
            fix=f"use a comma-separated subset of: {','.join(CHECKS)}",
        )
    return [c for c in CHECKS if c in chosen]


def add_child_arguments(parser: argparse.ArgumentParser) -> None:
    """What every run of children takes (the gate and the restart benchmark)."""
    parser.add_argument(
        "--device",
        type=str.upper,
        choices=DEVICES,
        help="PJRT device (default: TPU if this host has one, else CPU)",
    )
    parser.add_argument(
        "--workload",
        type=ValueType(workloads.resolve, "small", "workload"),
        default=workloads.DEFAULT,
        metavar="WORKLOAD",
        help=f"what to time: a preset ({', '.join(workloads.PRESETS)}; large is meant for "
        "TPU), your own model as path/to/file.py[:factory] or package.module:factory "
        '(protocol: docs/gate.md "Your own workload")',
    )
    parser.add_argument(
        "--child-timeout",
        type=amount(1, 7 * 86400, 600, "seconds"),
        default=600.0,
        metavar="SECONDS",
        help="per-child timeout; a hung child's process group is killed",
    )


def add_gate_arguments(gate: argparse.ArgumentParser) -> None:
    """The gate's own options (after :func:`add_child_arguments`)."""
    gate.add_argument(
        "--checks", default=",".join(CHECKS), help=f"comma-separated: {','.join(CHECKS)}"
    )
    gate.add_argument(
        "--out",
        type=OUTPUT_DIR,
        default=Path("out/gate"),
        help="directory for report.json, junit.xml and child logs",
    )
    gate.add_argument(
        "--warm-runs", type=count(2, 100, 2), default=2, help="warm restarts (2 to 100)"
    )
    gate.add_argument(
        "--max-warm-ratio",
        type=amount(0, 100, 0.5, "times the cold time"),
        default=restart.RestartConfig.max_warm_ratio,
        help="warm time-to-ready must be at most this fraction of cold",
    )
    gate.add_argument(
        "--baseline-tolerance",
        type=amount(0, 100, 0.5, "times the baseline"),
        default=restart.RestartConfig.baseline_tolerance,
        help="allowed slowdown against a recorded baseline (0.5 = 50%%)",
    )
    gate.add_argument(
        "--baselines-dir",
        type=Path,
        default=restart.DEFAULT_BASELINES_DIR,
        help="directory of the recorded warm-restart baselines (one per torch_xla version, "
        "device and workload)",
    )
    gate.add_argument(
        "--record-baseline",
        action="store_true",
        help="record this run's warm time as the baseline (only if it passes)",
    )
    gate.add_argument("--spmd", action="store_true", help="run the restart workload under SPMD")
    gate.add_argument(
        "--writers",
        type=count(1, 64, 1),
        default=1,
        help="concurrent cold processes writing the same cache directory",
    )
    gate.add_argument(
        "--xla-cache-dir",
        type=Path,
        help="empty XLA persistent compilation cache directory to use (default: the "
        "gate's own temporary one)",
    )
    gate.add_argument(
        "--keep-cache",
        action="store_true",
        help="keep the gate's temporary cache directory and print its path",
    )
    gate.add_argument(
        "--upstream-tests",
        type=Path,
        metavar="CHECKOUT",
        help="also run test/test_persistent_cache.py of this pytorch/xla checkout (work tree "
        "or bare repository) with its device skips lifted",
    )
    gate.add_argument(
        "--upstream-tests-revision",
        metavar="REV",
        help="read the test file at this revision (default: the work tree, else HEAD)",
    )
    gate.add_argument(
        "--profile",
        help="run every check under this launch profile of --bundle (e.g. train); the "
        "receipt records its name and digest",
    )
    gate.add_argument(
        "--receipts",
        metavar="STORE",
        help="also upload the receipt to this store: a directory, an http(s) WebDAV URL or "
        "gs://bucket/prefix (a lane's `receipts` in build/lanes.toml); credentials from "
        "XLA_WHEELS_RECEIPTS_USERNAME/XLA_WHEELS_RECEIPTS_PASSWORD",
    )
    gate.add_argument(
        "--sign-key",
        type=Path,
        metavar="PEM",
        help="sign the uploaded receipt (a DSSE envelope) with this ed25519 private key",
    )
    add_slice_arguments(gate)


def gate_config(
    args: argparse.Namespace,
    python: Path | Callable[[], Path],
    profile: under_profile.GateProfile | None,
) -> GateConfig:
    """The run :func:`xla_host.gate.run.run_gate` makes of the parsed arguments."""
    return GateConfig(
        python=python,
        device=args.device,
        checks=tuple(checks(args.checks)),
        workload=args.workload,
        child_timeout_s=args.child_timeout,
        warm_runs=args.warm_runs,
        max_warm_ratio=args.max_warm_ratio,
        baseline_tolerance=args.baseline_tolerance,
        baselines_dir=args.baselines_dir,
        record_baseline=args.record_baseline,
        spmd=args.spmd,
        writers=args.writers,
        xla_cache_dir=args.xla_cache_dir,
        keep_cache=args.keep_cache,
        upstream_tests=args.upstream_tests,
        upstream_tests_revision=args.upstream_tests_revision,
        out_dir=args.out,
        profile=profile,
        slice=slice_of(args),
        settings={k: str(v) for k, v in vars(args).items() if k != "handler"},
    )


def run_printed(config: GateConfig) -> GateOutcome:
    """Run the gate and print its verdicts and where its reports are (both CLIs); an
    environment that cannot be judged is printed, then raised (exit 2)."""
    try:
        outcome = run_gate(config)
    except GateEnvironmentError as error:
        print(render_text(None, [], error=error.message))
        raise
    print(render_text(outcome.target, outcome.results))
    if config.profile is not None:
        print("\n".join(config.profile.lines()))
    print(
        f"reports: {outcome.json_path} {outcome.junit_path} (child logs in {config.runs_dir})",
        flush=True,
    )
    return outcome


def add_slice_arguments(gate: argparse.ArgumentParser) -> None:
    """One gate run across the workers of a multi-host slice (``xla_host.slice``)."""
    gate.add_argument(
        "--worker-id",
        type=count(0, 4095, 0),
        help="this worker's number in a multi-host slice; worker 0 alone writes the cache "
        "(default: TPU_WORKER_ID where the TPU VM sets it, else no slice)",
    )
    gate.add_argument(
        "--workers",
        type=count(1, 4096, 1),
        help="number of workers (hosts) in the slice (default: the hosts in "
        "TPU_WORKER_HOSTNAMES, else no slice)",
    )
    gate.add_argument(
        "--slice-dir",
        type=Path,
        help="a fresh directory every worker sees (shared mount) where they meet at each "
        "phase; worker 0 merges the workers' verdicts into its receipt",
    )
    gate.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="instead of --slice-dir: worker 0 serves the slice's barrier on this address "
        "(its own host name or address) and every worker connects to it",
    )
    gate.add_argument(
        "--slice-timeout",
        type=amount(1, 86400, slices.JOIN_TIMEOUT_S, "seconds"),
        default=slices.JOIN_TIMEOUT_S,
        metavar="SECONDS",
        help="how long a worker waits at a phase for a worker that never started (a "
        f"started worker that stops beating is named after {slices.DEAD_AFTER_S:g}s)",
    )


def slice_of(args: argparse.Namespace) -> slices.SliceSpec | None:
    spec = slices.slice_spec(
        args.worker_id,
        args.workers,
        args.slice_dir,
        os.environ,
        timeout_s=args.slice_timeout,
        coordinator=args.coordinator,
    )
    if spec is not None and spec.workers > 1 and args.xla_cache_dir is None:
        raise UsageError(
            f"a slice of {spec.workers} workers shares one cache directory; none was given",
            fix="pass --xla-cache-dir DIR on the shared mount (empty; worker 0 writes it)",
        )
    return spec


def leaves_receipt(config: GateConfig) -> bool:
    """Whether this run leaves a receipt: one host, or worker 0 of a slice (whose receipt
    records every worker's verdicts)."""
    return config.slice is None or config.slice.writer


def ended_without_receipt(config: GateConfig, outcome: GateOutcome) -> int:
    """A slice's other worker: its verdicts went to worker 0; it fails as they do."""
    assert config.slice is not None
    print(f"no receipt from worker {config.slice.worker_id}: worker 0's records the slice")
    ensure_passed(outcome.results)
    return 0
