"""``xla-wheels bench-restart``: arguments and printing.

The gate is a host command (``xla_wheels.cli.checkout_source``, over
:mod:`xla_host.host_commands`); the restart benchmark is the builder's alone and shares
the gate's children's options (:func:`xla_host.gate.arguments.add_child_arguments`).
Without ``--python`` it times the cached stock torch_xla 2.9.0 environment (built on
first use, in the same per-machine cache as the pipeline's). Standard library only, like
the gate: the builder image runs it without the pipeline's dependencies.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from xla_host.gate import arguments as gate_arguments
from xla_host.gate import bench
from xla_host.gate.target import Target, resolve_target
from xla_host.gate.workload import WorkloadSpec
from xla_wheels import stock_envs as envs
from xla_wheels.cli.settings import Settings
from xla_wheels.options import machine_cache
from xla_wheels.settings_rows import add_settings

if TYPE_CHECKING:  # loaded when a run leaves its receipt (see _receipts)
    from xla_wheels.release.gate_receipt import ReceiptPlace


def _given_python(args: argparse.Namespace) -> Path | None:
    # Not resolved: a venv's python symlink must stay the venv's entry point.
    return Path(args.python).absolute() if args.python else None


def _python(args: argparse.Namespace) -> Path:
    return envs.resolve_python(_given_python(args), machine_cache(os.environ))


def _add_common(parser: argparse.ArgumentParser, command: str) -> None:
    """The benchmark's: the interpreter (else the cached stock environment), the
    children's options, and where the receipt's evidence is (as the gate's)."""
    add_settings(parser, command, "--python")
    gate_arguments.add_child_arguments(parser, command)
    # The receipt's options (:mod:`xla_wheels.release.gate_receipt`).
    parser.add_argument(
        "--bundle",
        help="bundle whose locked wheels the environment should be; the receipt goes to "
        "receipts/<bundle>/ (default: none: out/.../receipt.json, unusable to promote)",
    )
    add_settings(parser, command, "--root", "--wheel-dir")


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
    if name != "bench-restart":
        raise ValueError(f"{name} is not a subcommand of {__name__}")
    _add_common(parser, name)
    add_settings(parser, name, "--rounds", "--out")
    parser.set_defaults(handler=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    workload: WorkloadSpec = args.workload
    _check_bundle(args)
    out_dir: Path = args.out
    # The children's logs go where the results go, as the gate's do: an error names one,
    # and it must still be there to read. Only the compilation caches are scratch.
    runs_dir = out_dir / "runs"
    with tempfile.TemporaryDirectory(prefix="xla-bench-", ignore_cleanup_errors=True) as tmp:
        target: Target = resolve_target(
            _python(args),
            args.device,
            workdir=runs_dir,
            timeout_s=args.child_timeout,
            workload=workload,
        )
        summary = bench.run_bench(
            target, runs_dir, args.rounds, workload, args.child_timeout, caches=Path(tmp)
        )
        path = bench.write_bench(out_dir, summary)
        print(bench.render_bench(summary))
        print(f"kept as {path}")
        _receipts().leave_bench_receipt(_receipt_place(args), target, summary)
        return 0
