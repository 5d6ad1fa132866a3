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
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from xla_host import cache_role, log, receipt_signing
from xla_host.arguments import ValueType, add_setting, add_settings
from xla_host.errors import UsageError
from xla_host.gate import keyprobe, under_profile
from xla_host.gate import slice as slices
from xla_host.gate import workload as workloads
from xla_host.gate.errors import GateEnvironmentError
from xla_host.gate.report import render_text
from xla_host.gate.result import ensure_passed
from xla_host.gate.run import CHECKS, GateConfig, GateOutcome, run_gate
from xla_host.settings import by_flag


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


def add_child_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """What every run of children takes (the gate and the restart benchmark): rows of the
    settings table (``xla_host.settings``), the workload parsed by its protocol."""
    add_setting(parser, by_flag("--device"), command=command, kind=str.upper)
    workload = ValueType(workloads.resolve, "small", "workload")
    add_setting(parser, by_flag("--workload"), command=command, kind=workload)
    add_settings(parser, command, "--child-timeout")


def add_gate_arguments(gate: argparse.ArgumentParser) -> None:
    """The gate's own options (after :func:`add_child_arguments`), each a row of the
    settings table: both command lines (the builder's, the host's) take exactly these."""
    add_settings(gate, "gate", *GATE_FLAGS, *SLICE_FLAGS)
    # Every check by default, and --help names them: both from the registry.
    gate.set_defaults(checks=",".join(CHECKS))
    action = next(a for a in gate._actions if "--checks" in a.option_strings)
    action.help = f"{by_flag('--checks').help_with_default('gate')}: {action.default}"


#: The gate's own flags, in the order its --help shows them.
GATE_FLAGS = (
    "--checks", "--key-probes", "--out", "--warm-runs", "--max-warm-ratio", "--baseline-tolerance",
    "--baselines-dir", "--record-baseline", "--spmd", "--writers", "--xla-cache-dir",
    "--keep-cache", "--upstream-tests", "--upstream-tests-revision", "--profile",
    "--receipts", "--sign-key", "--pack", "--pack-key", "--role",
)  # fmt: skip
#: One gate run across the workers of a multi-host slice (``xla_host.gate.slice``).
SLICE_FLAGS = (
    "--worker-id", "--workers", "--slice-dir", "--coordinator", "--slice-timeout",
)  # fmt: skip


def gate_config(
    args: argparse.Namespace,
    python: Path | Callable[[], Path],
    profile: under_profile.GateProfile | None,
) -> GateConfig:
    """The run :func:`xla_host.gate.run.run_gate` makes of the parsed arguments."""
    check_key_flags(args)
    spec = slice_of(args)
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
        slice=spec,
        cache_role=gate_role(args.role, os.environ, spec, args.xla_cache_dir),
        pack_dir=args.pack,
        key_probes=tuple(
            keyprobe.select(
                keyprobe.load_probes(),
                None if args.key_probes is None else args.key_probes.split(","),
            )
        ),
        settings={k: str(v) for k, v in vars(args).items() if k != "handler"},
    )


def check_key_flags(args: argparse.Namespace) -> None:
    """The signing flags, refused before any child starts (a gate run takes minutes and
    they are used only at its end): each key with the flag it serves, and a usable ed25519
    private key (``receipt_signing.check_signing_key``)."""
    if args.pack is not None and (args.pack_key is None or not args.pack_key.is_file()):
        # An unsigned pack is one no host may install.
        raise UsageError(
            "--pack needs --pack-key, a file: a cache pack is signed, or no host installs it",
            fix="pass --pack-key <ed25519 private key PEM> with --pack DIR",
        )
    if args.pack_key is not None and args.pack is None:
        raise UsageError(
            "--pack-key is given without --pack: no cache pack would be written or signed",
            fix="pass --pack DIR with --pack-key (or leave out --pack-key)",
        )
    if args.sign_key is not None and not args.receipts:
        raise UsageError(
            "--sign-key is given without --receipts: it signs the receipt the gate uploads, "
            "and this run uploads none",
            fix="pass --receipts <store> with --sign-key (or leave out --sign-key: the "
            "receipt is still written under --out)",
        )
    for flag, key in (("--pack-key", args.pack_key), ("--sign-key", args.sign_key)):
        if key is not None:
            receipt_signing.check_signing_key(key, flag)


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


def gate_role(
    flag: str | None,
    env: Mapping[str, str],
    spec: slices.SliceSpec | None,
    cache_dir: Path | None,
) -> cache_role.CacheRole:
    """The gate's role on ``cache_dir`` by the one rule (:func:`xla_host.cache_role.decide`).

    In a slice the worker number decides (``--worker-id`` or ``TPU_WORKER_ID``): worker 0
    writes the shared cache and records the slice's receipt, so an explicit role that says
    otherwise is refused rather than run as a slice with no writer or two. A reader needs
    the cache it reads: the gate's own temporary one holds nothing."""
    decided = cache_role.decide(flag, env)
    if spec is not None:
        number = f"{cache_role.WORKER}={spec.worker_id}"
        if env.get(cache_role.WORKER, "").strip() != str(spec.worker_id):
            number = f"--worker-id {spec.worker_id}"
        by_slice = cache_role.of_worker(spec.worker_id, number)
        if decided.explicit and decided.role != by_slice.role:
            raise UsageError(
                f"{decided.describe()} contradicts this worker's place in the slice: "
                f"{by_slice.describe()} (worker {cache_role.WRITER_WORKER} writes the shared "
                "cache and records the slice)",
                fix=f"leave the role to the worker number in a gate slice: drop --role, unset "
                f"{cache_role.ROLE_VARIABLE} (and {cache_role.READ_ONLY} on worker "
                f"{cache_role.WRITER_WORKER})",
            )
        if not decided.explicit:  # an explicit role that agrees keeps its own reason
            decided = replace(by_slice, warning=decided.warning)
    if not decided.writer and cache_dir is None:
        raise UsageError(
            f"this gate is a {decided.describe()}, and a reader reads a shared cache "
            "directory: none was given",
            fix="pass --xla-cache-dir <the shared cache directory its writer fills>, or "
            "--role writer to gate with a cache of its own",
        )
    if decided.warning:
        log.warning(decided.warning)
    return decided


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
