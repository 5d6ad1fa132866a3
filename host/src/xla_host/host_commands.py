"""The host commands, written once for both command lines: ``gate``, ``doctor`` and
``launch-env``.

``xla-host`` (:mod:`xla_host.cli`) runs them over a lane's bundle document
(:mod:`xla_host.lane_source`), ``xla-wheels`` over the checkout
(``xla_wheels.cli.checkout_source``); both through the protocol of
:mod:`xla_host.bundle_source`. A command's own flags are the settings table's rows,
listed here once (:data:`FLAGS`), so both command lines' help and defaults come from the
one row; each command line adds only the flags that name its bundle.

- ``doctor``: the runtime contract of this host's environment (or a launcher's env file),
  the installed packages against the bundle (the checkout adds provenance, SBOM, ABI), the
  cache contract, the launch profile (``--profile``), then what only the source can say
  (the checkout: lanes.lock, signatures); with ``--json``/``--stamp`` the audit stamp.
- ``launch-env``: ``env.sh``, ``env.json`` and the pre-import helper
  ``xla_launch_profile.py``, written as one, after the lane's cache pack when asked
  (``--pack-lane``), under ``--out`` (default ``<out-dir>/launch/<bundle>/<profile>-<role>``).
- ``gate``: the gate's run (:func:`xla_host.gate_end.run_and_leave`) and its receipt: the
  environment compared with the bundle's wheels, sealed under ``receipts/<bundle>/`` of the
  source; without a bundle, ``<out>/receipt.json``, for no bundle's wheels.

These are the command lines' handlers: they print what a command produced (the library
below them never does).
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from xla_host import cache_role, host_doctor, launch_profile, log, stamp
from xla_host.arguments import add_settings
from xla_host.bundle_source import HELPER_NAME, BundleSource, CommandLine
from xla_host.errors import CheckFailed, UsageError
from xla_host.host_probe import probe

if TYPE_CHECKING:  # imported by the gate's handler when a gate runs
    from xla_host.gate.run import GateOutcome
    from xla_host.gate.under_profile import GateProfile

#: Each host command's own flags, each a row of the settings table, on both command lines
#: (the gate's own: :data:`xla_host.gate.arguments.GATE_FLAGS`, after these).
FLAGS: dict[str, tuple[str, ...]] = {
    "doctor": (
        "--python", "--role", "--cache-path", "--profile", "--env-file", "--json", "--stamp",
    ),
    "launch-env": (
        "--python", "--profile", "--role", "--out", "--pack-lane", "--pack-workload",
        "--pack-public-key",
    ),
    "gate": ("--python",),
}  # fmt: skip


def add_arguments(name: str, parser: argparse.ArgumentParser, line: CommandLine) -> None:
    """Host command ``name``'s arguments on ``parser``: ``line``'s flags that name the
    bundle, then the command's rows (:data:`FLAGS`); its handler."""
    line.add_source_arguments(parser, name)
    add_settings(parser, name, *FLAGS[name], table=line.table)
    if name == "gate":
        from xla_host.gate import arguments as gate_arguments  # the gate's, defined once

        gate_arguments.add_child_arguments(parser, name)
        gate_arguments.add_gate_arguments(parser)
    parser.set_defaults(handler=functools.partial(HANDLERS[name], line=line))


def _source(line: CommandLine, args: argparse.Namespace, command: str) -> BundleSource:
    source = line.source(args, command)
    if source is None:
        raise UsageError(
            f"which bundle? {line.bundle_flags} are required",
            fix=f"pass {line.spell('--bundle', '<name>')}",
        )
    return source


def _python(line: CommandLine, args: argparse.Namespace, command: str) -> Path:
    python = line.python(args, command)
    return python if isinstance(python, Path) else python()


def _role(given: str | None, env: Mapping[str, str]) -> cache_role.CacheRole:
    """This host's cache role by the one rule (:mod:`xla_host.cache_role`), a
    contradiction with the read-only switch said."""
    decided = cache_role.decide(given, env)
    if decided.warning:
        log.warning(decided.warning)
    return decided


# --- doctor ---------------------------------------------------------------------------


def launch_environment(env_file: Path | None, line: CommandLine) -> tuple[Mapping[str, str], str]:
    """What doctor judges: this process's environment (the host's shell, a launcher's), or
    a launcher's env file (``--env-file``: env.sh or env.json of ``launch-env``)."""
    if env_file is None:
        return os.environ, "this host's environment"
    try:
        return launch_profile.read_env_file(env_file), str(env_file)
    except (OSError, ValueError) as error:
        written_by = line.invocation("launch-env")
        raise UsageError(
            f"cannot read the launch environment {env_file}: {error}",
            fix="pass "
            + line.spell(
                "--env-file",
                f"<env.sh or env.json written by `{written_by}`, or a " "NAME=value file>",
            ),  # fmt: skip
        ) from error


def run_doctor(args: argparse.Namespace, line: CommandLine) -> int:
    """Doctor (module doc): the findings on stdout, or with ``--json`` the stamp there and
    the findings on stderr; exit 1 when a check failed."""
    source = _source(line, args, "doctor")
    python = _python(line, args, "doctor")
    # The host's own environment is what doctor judges (PJRT_DEVICE, XLA_* runtime flags,
    # TPU_WORKER_ID): the subject of the check, not a setting of this program. With
    # --env-file, the launcher's variables over this host's (its TPU_WORKER_ID).
    env, where = launch_environment(args.env_file, line)
    role = _role(args.role, env if args.env_file is None else {**os.environ, **env})
    profile = (
        launch_profile.choose(source.profiles, args.profile, source.bundle)
        if args.profile
        else None
    )
    report = source.doctor_report(str(python))
    # The environment first: it must be right before anything imports torch_xla.
    host_doctor.check_environment(
        report, env, role, platform=host_doctor.platform_of(source.profiles)
    )
    facts = probe(
        str(python),
        [*host_doctor.PACKAGES, *source.probe_packages()],
        fix="pass " + line.spell("--python", "<the training environment's python>"),
    )
    source.check_installed(report, facts, python)
    host_doctor.check_cache(report, source.bundle, facts.versions, env, role, args.cache_path)
    if profile is not None:
        launch_env = line.invocation(
            "launch-env", ("--bundle", source.bundle), ("--profile", profile.name),
            ("--role", role.role),
        )  # fmt: skip
        host_doctor.check_launch_profile(
            report, profile, source.bundle, env, role.role, where, facts.versions, launch_env
        )
    source.check_lane(report)
    stamp_path: Path | None = args.stamp or stamp.stamp_file(os.environ)
    if args.json or stamp_path:
        # The audit stamp (xla_host.stamp owns the format): the findings go to stderr,
        # stdout holds the one document.
        print(report.render(), file=sys.stderr if args.json else sys.stdout)
        known = source.stamped(python)
        found = stamp.Stamp(
            created=stamp.now(),
            host=stamp.this_host(),
            bundle=source.bundle,
            lane=known.lane,
            wheels=known.wheels,
            receipt_digest=known.receipt_digest,
            profile=profile.name if profile else None,
            profile_sha256=profile.sha256 if profile else None,
            cache_path=args.cache_path or env.get(launch_profile.CACHE_PATH) or None,
            role=role.role,
            verdict="failed" if report.failed else "ok",
            problems=tuple(f"{f.check}: {f.detail}" for f in report.failed),
            job=stamp.job_facts(env),
        )
        if args.json:
            print(found.render(), end="")
        if stamp_path:
            stamp.write_stamp(stamp_path, found)
            log.info(f"doctor: stamp written to {stamp_path}")
    else:
        print(report.render())
    if report.failed:
        raise CheckFailed(
            f"doctor found {len(report.failed)} problem(s): "
            + ", ".join(f.check for f in report.failed),
            fix=f"apply the fixes listed above, then {line.again('doctor', source.bundle)}",
        )
    return 0


# --- launch-env -----------------------------------------------------------------------


def run_launch_env(args: argparse.Namespace, line: CommandLine) -> int:
    """launch-env (module doc); exit 1 a refused pack (nothing installed, nothing written)."""
    from xla_host import cache_command, filemode

    source = _source(line, args, "launch-env")
    profile = launch_profile.choose(source.profiles, args.profile, source.bundle)
    decided = _role(args.role, os.environ)
    role = decided.role
    build = source.build_directory() if profile.needs_build else None
    out: Path = args.out or source.out_dir / "launch" / source.bundle / f"{profile.name}-{role}"
    files: list[tuple[Path, bytes | str]] = [
        (out / name, text)
        for name, text in launch_profile.launch_files(profile, source.bundle, role, build).items()
    ]
    files.append((out / HELPER_NAME, source.launch_helper()))
    # --pack-lane: the lane's pack installed into the profile's cache directory before
    # anything is written: a refused pack leaves the launch files as they were.
    request = cache_command.pack_request(
        args.pack_lane, args.pack_workload, args.pack_public_key, os.environ
    )
    if request is not None:
        # The job's device and topology: the profile's settings over this host's.
        env = {**os.environ, **profile.environment(source.bundle, role, build)}
        fetched = cache_command.launch_pack(
            request, source.bundle, env, role, _python(line, args, "launch-env"),
            line.network(args),
        )  # fmt: skip
        print(fetched.line() if fetched else cache_command.not_fetched(
            env.get(launch_profile.CACHE_PATH)))  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    # The three files are one launch environment: all of them or, on a failure (a full
    # disk), none changed.
    filemode.write_all(files)
    print(f"launch profile {profile.name} of {source.bundle}, role {decided.describe()}, "
          f"written to {out}:")  # fmt: skip
    # Lines to copy: the path quoted for the shell, and as a Python string literal.
    env_sh, env_json = shlex.quote(str(out / "env.sh")), repr(str(out / "env.json"))
    print(f"  . {env_sh}    # in the launcher, before the training process starts")
    print(f"  xla_launch_profile.apply({env_json})    # or first thing in training code")
    return 0


# --- gate -----------------------------------------------------------------------------


def run_gate(args: argparse.Namespace, line: CommandLine) -> int:
    """The gate (module doc); its exit codes are :func:`xla_host.gate_end.run_and_leave`'s."""
    from xla_host import gate_end
    from xla_host.gate import arguments as gate_arguments
    from xla_host.gate import under_profile
    from xla_host.gate.target import default_device

    gate_arguments.checks(args.checks)  # before the bundle is read
    # Without a bundle (the builder's ship check judges a staging directory): verdicts
    # only, and a receipt that says it is for no bundle's wheels.
    source = line.source(args, "gate")
    profile = None
    if args.profile:
        if source is None:
            raise UsageError(
                f"a launch profile belongs to a bundle: --profile needs {line.bundle_flags}",
                fix=f"pass {line.spell('--bundle', '<bundle>')} with "
                f"{line.spell('--profile', args.profile)}",
            )
        chosen = launch_profile.choose(source.profiles, args.profile, source.bundle)
        profile = under_profile.plan(chosen, source.bundle, args.device or default_device())
        for planned in profile.lines():
            log.info(planned)
    python = line.python(args, "gate")
    config = gate_arguments.gate_config(args, python, profile)

    def write_receipt(outcome: GateOutcome) -> Path:
        return _write_gate_receipt(args, outcome, source, profile)

    return gate_end.run_and_leave(
        args, config, bundle=source.bundle if source else None, network=line.network(args),
        write_receipt=write_receipt,
    )  # fmt: skip


def _write_gate_receipt(
    args: argparse.Namespace,
    outcome: GateOutcome,
    source: BundleSource | None,
    profile: GateProfile | None,
) -> Path:
    """The receipt of a gate run: the environment compared with the bundle's wheels (no
    bundle: a staging directory's ship check, a receipt for no bundle), its path."""
    from xla_host import installed, receipt_verdict, receipts

    python = outcome.target.python
    if source is None:
        facts, match = installed.probe_environment(python, []), None
    else:
        facts, match = source.receipt_evidence(python)
    receipt = receipts.receipt_from_gate(
        outcome.target,
        outcome.results,
        bundle=source.bundle if source else None,
        workload=args.workload.name,
        facts=facts,
        match=match,
    )
    digest = source.document_sha256 if source else None
    receipt = replace(
        receipt,
        bundle_document=f"sha256:{digest}" if digest else None,
        profile=profile.record() if profile else None,
        slice=outcome.slice_record,
    )
    out: Path = args.out
    if source is None:
        path = receipts.write_receipt(out / "receipt.json", receipt, replace=True)
    else:
        path = receipts.write_receipt(
            receipts.receipt_path(source.receipts_root(out), receipt), receipt
        )
    log.result(f"receipt: {path} ({receipt_verdict.judge(receipt).gate_label})")
    return path


HANDLERS: dict[str, Callable[..., int]] = {
    "doctor": run_doctor,
    "launch-env": run_launch_env,
    "gate": run_gate,
}
