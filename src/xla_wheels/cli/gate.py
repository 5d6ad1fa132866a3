"""``xla-wheels gate`` and ``xla-wheels bench-restart``: arguments and printing.

The gate's run itself (which checks share children, what runs side by side) is
:func:`xla_host.gate.run.run_gate`; this module parses, prints and leaves the receipt.

Exit codes of ``gate``: 0 every selected check passed; 1 a check failed (the verdict says
which and why); 2 the environment cannot be judged (no torch_xla, no such device); 8 a
worker of a slice did not arrive at a phase (``xla_host.slice``).
Without ``--python`` both commands use the cached stock torch_xla 2.9.0 environment
(built on first use, in the same per-machine cache as the pipeline's), so a newcomer
sees the persistent-cache defect in one command. Standard library only, like the whole
gate: the builder image runs it as the ship check without the pipeline's dependencies.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from xla_host import log
from xla_host import slice as slices
from xla_host.errors import UsageError
from xla_host.gate import bench, restart, under_profile
from xla_host.gate import run as gate_run
from xla_host.gate.errors import GateEnvironmentError
from xla_host.gate.report import render_text
from xla_host.gate.result import ensure_passed
from xla_host.gate.run import CHECKS
from xla_host.gate.target import DEVICES, Target, default_device, resolve_target
from xla_wheels import stock_envs as envs
from xla_wheels.cli.arguments import OUTPUT_DIR, amount, count
from xla_wheels.cli.settings import Settings
from xla_wheels.options import machine_cache

if TYPE_CHECKING:  # loaded when a run leaves its receipt (see _receipts)
    from xla_wheels.release.gate_receipt import ReceiptPlace

WORKLOADS = ("small", "medium", "large")


def _checks(value: str) -> list[str]:
    chosen = [c.strip() for c in value.split(",") if c.strip()]
    unknown = sorted(set(chosen) - set(CHECKS))
    if unknown or not chosen:
        raise UsageError(
            f"unknown check(s) {', '.join(unknown) or '(none given)'}",
            fix=f"use a comma-separated subset of: {','.join(CHECKS)}",
        )
    return [c for c in CHECKS if c in chosen]


def _given_python(args: argparse.Namespace) -> Path | None:
    # Not resolved: a venv's python symlink must stay the venv's entry point.
    return Path(args.python).absolute() if args.python else None


def _python(args: argparse.Namespace) -> Path:
    return envs.resolve_python(_given_python(args), machine_cache(os.environ))


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--python",
        help="interpreter of the torch_xla environment to judge "
        f"(default: cached stock torch_xla {envs.DEFAULT_STOCK})",
    )
    parser.add_argument(
        "--device",
        type=str.upper,
        choices=DEVICES,
        help="PJRT device (default: TPU if this host has one, else CPU)",
    )
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="small",
        help="validation workload preset (large is meant for TPU)",
    )
    parser.add_argument(
        "--child-timeout",
        type=amount(1, 7 * 86400, 600, "seconds"),
        default=600.0,
        metavar="SECONDS",
        help="per-child timeout; a hung child's process group is killed",
    )
    # The receipt's options (:mod:`xla_wheels.release.gate_receipt`).
    parser.add_argument(
        "--bundle",
        help="bundle whose locked wheels the environment should be; the receipt goes to "
        "receipts/<bundle>/ (default: none: out/.../receipt.json, unusable to promote)",
    )
    parser.add_argument(
        "--root",
        type=Path,
        help="project checkout holding wheels.lock and receipts/ (default: $XLA_WHEELS_ROOT or .)",
    )
    parser.add_argument(
        "--wheel-dir",
        type=Path,
        help="where the locked wheel files are, to compare with what is installed "
        "(default: <root>/dist/<bundle>)",
    )


def _receipts():  # noqa: ANN202 - the module
    # Imported when a run leaves its receipt, not before: reading wheels.lock and the
    # installed wheels loads the lock and publish modules, which `gate --help` must not.
    from xla_wheels.release import gate_receipt

    return gate_receipt


def _checkout(args: argparse.Namespace) -> Path:
    """The gate's project checkout: --root, else $XLA_WHEELS_ROOT, else the current directory."""
    return (Settings(args, os.environ).path("--root") or Path(".")).resolve()


def _receipt_place(args: argparse.Namespace) -> ReceiptPlace:
    return _receipts().ReceiptPlace(
        root=_checkout(args),
        bundle=args.bundle,
        wheel_dir=args.wheel_dir,
        out_dir=Path(args.out),
        cache_dir=machine_cache(os.environ),
    )


def _check_bundle(args: argparse.Namespace) -> None:
    """Before a run of minutes: a named bundle must be in wheels.lock."""
    if args.bundle:
        _receipts().locked_records(_checkout(args) / "wheels.lock", args.bundle)


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Define subcommand ``name``'s arguments on ``parser`` and set its handler."""
    if name == "gate":
        _add_gate_arguments(parser)
    elif name == "bench-restart":
        _add_common(parser)
        parser.add_argument(
            "--rounds", type=count(1, 1000, 5), default=5, help="restarts per phase (1 to 1000)"
        )
        parser.add_argument(
            "--out",
            type=OUTPUT_DIR,
            default=Path("out/bench"),
            help="directory the benchmark writes its results into",
        )
        parser.set_defaults(handler=run_bench)
    else:
        raise ValueError(f"{name} is not a subcommand of {__name__}")


def _add_gate_arguments(gate: argparse.ArgumentParser) -> None:
    _add_common(gate)
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
    _add_slice_arguments(gate)
    gate.set_defaults(handler=run_gate)


def _add_slice_arguments(gate: argparse.ArgumentParser) -> None:
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


def _slice(args: argparse.Namespace) -> slices.SliceSpec | None:
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


def _gate_profile(args: argparse.Namespace) -> under_profile.GateProfile | None:
    """The bundle's launch profile as this run applies it (None: no --profile)."""
    if not args.profile:
        return None
    if not args.bundle:
        raise UsageError(
            "a launch profile belongs to a bundle: --profile needs --bundle",
            fix=f"pass BUNDLE=<bundle> with PROFILE={args.profile}",
        )
    # Imported here: `gate --help` and a gate run without a profile do not read manifests.
    from xla_host import launch_profile
    from xla_wheels.bundle import load_bundle

    bundle = load_bundle(_checkout(args), args.bundle)
    profile = launch_profile.choose(bundle.profiles, args.profile, bundle.name)
    planned = under_profile.plan(profile, bundle.name, args.device or default_device())
    for line in planned.lines():
        log.info(line)
    return planned


def run_gate(args: argparse.Namespace) -> int:
    checks = _checks(args.checks)
    slice_spec = _slice(args)
    _check_bundle(args)
    gate_profile = _gate_profile(args)
    config = gate_run.GateConfig(
        python=lambda: envs.resolve_python(_given_python(args), machine_cache(os.environ)),
        device=args.device,
        checks=tuple(checks),
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
        profile=gate_profile,
        settings={k: str(v) for k, v in vars(args).items() if k != "handler"},
        slice=slice_spec,
    )
    try:
        outcome = gate_run.run_gate(config)
    except GateEnvironmentError as error:
        print(render_text(None, [], error=error.message))
        raise
    print(render_text(outcome.target, outcome.results))
    if gate_profile is not None:
        print("\n".join(gate_profile.lines()))
    print(
        f"reports: {outcome.json_path} {outcome.junit_path} (child logs in {config.runs_dir})",
        flush=True,
    )
    if slice_spec is not None and not slice_spec.writer:
        print(f"no receipt from worker {slice_spec.worker_id}: worker 0's records the slice")
    else:
        _receipts().leave_gate_receipt(
            _receipt_place(args),
            outcome.target,
            outcome.results,
            args.workload,
            profile=gate_profile.record() if gate_profile else None,
            slice_record=outcome.slice_record,
        )
    ensure_passed(outcome.results)
    return 0


def run_bench(args: argparse.Namespace) -> int:
    _check_bundle(args)
    out_dir: Path = args.out
    # The children's logs go where the results go, as the gate's do: an error names one,
    # and it must still be there to read. Only the compilation caches are scratch.
    runs_dir = out_dir / "runs"
    with tempfile.TemporaryDirectory(prefix="xla-bench-", ignore_cleanup_errors=True) as tmp:
        target: Target = resolve_target(
            _python(args), args.device, workdir=runs_dir, timeout_s=args.child_timeout
        )
        summary = bench.run_bench(
            target, runs_dir, args.rounds, args.workload, args.child_timeout, caches=Path(tmp)
        )
        path = bench.write_bench(out_dir, summary)
        print(bench.render_bench(summary))
        print(f"kept as {path}")
        _receipts().leave_bench_receipt(_receipt_place(args), target, summary)
        return 0
