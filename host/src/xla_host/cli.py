"""``xla-host``: the host's own command, ``gate``, ``doctor``, ``launch-env`` and ``cache``
from the lane, no checkout.

A host installs only the host wheel (``xla-wheels-host``, standard library only) into its
torch environment, by hash, from the lane; then::

    xla-host doctor --lane https://lanes.corp/validation/ --bundle v6e-2.11
    xla-host gate   --lane https://lanes.corp/validation/ --bundle v6e-2.11 --out out/gate

Both fetch the bundle document (:mod:`xla_host.bundle_document`) from the lane (a
directory, or the URL serving it), verify its sha256 (``--bundle-sha256``, else the
lane's index), and judge this environment against it; ``--bundle-document FILE`` reads a
document given as a file instead.

This module owns the ``xla-host`` console script and ``python -m xla_host``: the same
command line on every machine, whatever else is installed. The builder's command is
``xla-wheels`` (``xla_wheels.cli``, a checkout's ``.venv``), whose ``--lane`` names a lane
of ``build/lanes.toml``, not a URL; a builder command given here is refused with the
builder's command line as the fix. The same edge as the builder's (:mod:`xla_host.edge`):
``error:``/``fix:``, exit 0 ok, 1 a check judged against, 2 bad input or cannot judge, 8
the lane did not answer in time, 10 a disk fault, 130 interrupted.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import xla_host
from xla_host import (
    bundle_document,
    host_doctor,
    installed,
    lane_address,
    log,
    net,
    receipt_verdict,
    receipts,
)
from xla_host.arguments import OUTPUT_DIR, add_settings, machine_cache
from xla_host.edge import Parser, exit_code_of
from xla_host.errors import CheckFailed, UsageError
from xla_host.host_probe import probe

if TYPE_CHECKING:  # imported by run_gate when a gate runs
    from xla_host.cache_role import CacheRole
    from xla_host.gate.run import GateOutcome
    from xla_host.gate.under_profile import GateProfile

#: The command line's name, in usage lines, examples and fixes.
PROG = "xla-host"
#: The builder's command (``xla_wheels.cli``), named when a builder command is given here.
BUILDER_PROG = "xla-wheels"
HOST_COMMANDS = {
    "gate": "decide whether this environment may ship the bundle (warm restart, HBM query); "
    "the receipt goes to --out",
    "doctor": "check this host against the bundle's document (the runtime contract: "
    "PJRT_DEVICE, XLA_NO_SPECIAL_SCALARS, the cache path; versions, installed files) "
    "without importing torch_xla",
    "launch-env": "write the bundle's launch profile for a launcher (env.sh, env.json) from "
    "its document",
    "cache": "cache packs: `cache fetch` installs a signed pack so this host starts warm",
}


class _Version(argparse.Action):
    """``--version``: the installed version is read only when asked for (xla_host.__getattr__)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        sys.stdout.write(f"{parser.prog} {xla_host.__version__}\n")  # as argparse's own
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    """The ``xla-host`` console script and ``python -m xla_host`` (module doc)."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    return exit_code_of(lambda: _run(arguments))


def build_parser() -> argparse.ArgumentParser:
    from xla_host.gate import arguments as gate_arguments  # the gate's, defined once

    parser = Parser(
        prog=PROG,
        description="The host side of xla-wheels: judge this environment against a bundle "
        "published in a lane.",
        epilog=f"example:\n  {PROG} gate --lane https://lanes.corp/validation/ --bundle "
        f"v6e-2.11\n\nEvery command's options: {PROG} COMMAND --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in HOST_COMMANDS.items():
        if name == "cache":  # no bundle document: a pack is verified on its own
            from xla_host import cache_command

            cache = commands.add_parser(name, help=help_text, description=help_text)
            cache_command.add_arguments(name, cache)
            continue
        sub = commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=f"example:\n  {PROG} {name} --lane https://lanes.corp/validation/ "
            "--bundle v6e-2.11",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _add_document_arguments(sub)
        sub.add_argument(
            "--python",
            type=Path,
            help="interpreter of the torch_xla environment to judge (default: this one)",
        )
        if name == "gate":
            gate_arguments.add_child_arguments(sub, name)
            gate_arguments.add_gate_arguments(sub)
            sub.set_defaults(handler=run_gate)
        elif name == "launch-env":
            sub.add_argument("--profile", default="", help="launch profile name, e.g. train")
            add_settings(sub, name, "--role")  # its row: the flag, else XLA_WHEELS_ROLE
            sub.add_argument(
                "--out",
                type=OUTPUT_DIR,
                help="directory to write into (default: out/launch/<bundle>/<profile>-<role>)",
            )
            # Start warm: the lane's cache pack installed before the job (a writer only).
            add_settings(sub, name, "--pack-lane", "--pack-workload", "--pack-public-key")
            sub.set_defaults(handler=run_launch_env)
        else:
            # The builder's doctor's flags, from the same rows: this host's role on a shared
            # cache, the audit stamp, the launch environment and cache path to judge
            # instead of this process's.
            add_settings(sub, name, "--role", "--cache-path", "--env-file", "--json", "--stamp")
            sub.set_defaults(handler=run_doctor)
    return parser


def _add_document_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lane",
        help="the lane: its directory, or the URL serving it (its root or its simple/ index)",
    )
    parser.add_argument("--bundle", help="the bundle whose document to fetch from the lane")
    parser.add_argument(
        "--bundle-sha256",
        metavar="HEX",
        help="the document's sha256 (`make publish`, `make lanes`): required unless the "
        "lane's index lists it",
    )
    parser.add_argument(
        "--bundle-document",
        type=Path,
        metavar="FILE",
        help="a bundle document given as a file, instead of --lane/--bundle",
    )
    parser.add_argument(
        "--wheel-dir",
        type=Path,
        help="where the document's wheel files are kept to compare with the installed "
        "files; missing ones are fetched from --lane by hash (default: the per-machine "
        "cache, $XLA_WHEELS_CACHE or ~/.cache/xla-wheels)",
    )
    # The builder's rows, the same ranges and XLA_WHEELS_NET_* variables (policy_from).
    net.add_network_arguments(parser)


def _run(arguments: list[str]) -> int:
    if arguments and not arguments[0].startswith("-") and arguments[0] not in HOST_COMMANDS:
        name = arguments[0]
        close = difflib.get_close_matches(name, HOST_COMMANDS, n=1)
        raise UsageError(
            f"{name} is not a command of {PROG} (the host's: {', '.join(HOST_COMMANDS)}); "
            f"a builder command runs as `{BUILDER_PROG} {name}`",
            fix=(f"did you mean `{PROG} {close[0]}`? " if close else "")
            + f"run `{BUILDER_PROG} {name} ...` in the project's checkout (its `.venv`, "
            f"`make venv`), or use one of: {', '.join(HOST_COMMANDS)}",
        )
    parser = build_parser()
    try:
        args = parser.parse_args(arguments)
    except argparse.ArgumentError as error:
        flag = (error.argument_name or "argument").split("/")[0]
        raise UsageError(f"{flag}: {error.message}", fix=f"see `{PROG} --help`") from None
    if hasattr(args, "net_timeout"):
        # The flags, else their XLA_WHEELS_* variables, checked before anything runs.
        args.network = net.policy_from(args, os.environ)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


def _document(args: argparse.Namespace) -> tuple[bundle_document.BundleDocument, str]:
    if args.bundle_document is not None:
        document, digest = bundle_document.read_file(
            args.bundle_document, sha256=args.bundle_sha256
        )
        if args.bundle and args.bundle != document.bundle:
            raise UsageError(
                f"{args.bundle_document} is the document of bundle {document.bundle}, not "
                f"{args.bundle}",
                fix="pass the document of the bundle you mean, or leave out --bundle",
            )
        return document, digest
    lane = _lane(args)
    if lane is None or not args.bundle:
        raise UsageError(
            "which bundle? --lane and --bundle (or --bundle-document) are required",
            fix="pass --lane <the lane's directory or URL> --bundle <name>",
        )
    return bundle_document.fetch(
        lane, args.bundle, sha256=args.bundle_sha256, network=_network(args)
    )


def _lane(args: argparse.Namespace) -> lane_address.LaneAddress | None:
    """``--lane``, read as a lane address (one of :data:`xla_host.lane_address.FORMS`)."""
    return lane_address.parse(args.lane) if args.lane else None


def _network(args: argparse.Namespace) -> net.NetworkPolicy:
    policy: net.NetworkPolicy = args.network
    return policy


def _cache() -> Path:
    return machine_cache(os.environ)


def _compare_files(
    args: argparse.Namespace, document: bundle_document.BundleDocument, python: Path
) -> tuple[installed.InstalledFacts, installed.EnvironmentMatch]:
    """This environment against the document's wheels, file by file, the wheel files
    fetched from the lane by hash when not at hand."""
    wheel_dir = args.wheel_dir or _cache() / "lane-wheels"
    with log.section(f"compare the environment with the wheels of bundle {document.bundle}"):
        bundle_document.wheel_files(_lane(args), document.wheels, wheel_dir,
                                    network=_network(args))  # fmt: skip
        return installed.match_environment(
            python, document.wheels, wheel_dir, _cache() / "wheel-content"
        )


def _python(args: argparse.Namespace) -> Path:
    # Not resolved: a venv's python symlink must stay the venv's entry point.
    return args.python.absolute() if args.python else Path(sys.executable)


def run_doctor(args: argparse.Namespace) -> int:
    """The host's doctor: the checks that need no checkout (:mod:`xla_host.host_doctor`,
    the same the builder's doctor runs) against the lane's document."""
    from xla_host import launch_profile, stamp

    document, digest = _document(args)
    python = _python(args)
    env, _ = _launch_environment(args.env_file)
    role = _cache_role(args, env)
    report = host_doctor.HostReport(document.bundle, str(python), document_sha256=digest)
    # The environment first: it must be right before anything imports torch_xla.
    host_doctor.check_environment(
        report, env, role, platform=host_doctor.platform_of(document.profiles)
    )
    facts = probe(
        str(python),
        [*host_doctor.PACKAGES, *document.pins],
        fix="pass --python <the training environment's python>",
    )
    urls = None
    lane = _lane(args)
    if lane is not None:
        # The lane's install list, judged against the document (a moved lane whose list
        # did not follow installs other wheels), and the install line that answers.
        served = bundle_document.install_list(lane, network=_network(args))
        urls = bundle_document.install_urls(lane) if served is not None else None
        host_doctor.check_install_list(
            report, document, served, bundle_document.install_urls(lane)[1]
        )
    fix = host_doctor.install_fix(urls)
    host_doctor.check_versions(report, document, facts, fix)
    _, match = _compare_files(args, document, python)
    host_doctor.check_files(report, match, fix)
    host_doctor.check_cache(report, document.bundle, facts.versions, env, role, args.cache_path)
    stamp_path: Path | None = args.stamp or stamp.stamp_file(os.environ)
    if args.json or stamp_path:
        # The audit stamp, as the builder's doctor writes it (xla_host.stamp owns the
        # format): the findings go to stderr, stdout holds the one document.
        print(report.render(), file=sys.stderr if args.json else sys.stdout)
        found = stamp.Stamp(
            created=stamp.now(),
            host=stamp.this_host(),
            bundle=document.bundle,
            lane=document.lane,
            wheels=tuple(stamp.StampedWheel(m.name, m.sha256, m.matched) for m in match.wheels),
            receipt_digest=None,  # the document names no receipt: the lane's record does
            profile=None,
            profile_sha256=None,
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
            fix="apply the fixes listed above, then run the same command again",
        )
    return 0


def _cache_role(args: argparse.Namespace, env: Mapping[str, str]) -> CacheRole:
    """This host's cache role by the one rule (:mod:`xla_host.cache_role`), a contradiction
    with the read-only switch said. ``env`` is what doctor judges: with ``--env-file`` the
    launcher's variables over this host's (its ``TPU_WORKER_ID``)."""
    from xla_host import cache_role

    decided = cache_role.decide(args.role, env if env is os.environ else {**os.environ, **env})
    if decided.warning:
        log.warning(decided.warning)
    return decided


def _launch_environment(env_file: Path | None) -> tuple[Mapping[str, str], str]:
    """What doctor judges: this process's environment (the host's shell, a launcher's), or
    a launcher's env file (``--env-file``: env.sh or env.json of ``launch-env``)."""
    from xla_host import launch_profile

    if env_file is None:
        return os.environ, "this host's environment"
    try:
        return launch_profile.read_env_file(env_file), str(env_file)
    except (OSError, ValueError) as error:
        raise UsageError(
            f"cannot read the launch environment {env_file}: {error}",
            fix="pass --env-file <env.sh or env.json written by `launch-env`, or a "
            "NAME=value file>",
        ) from error


def run_launch_env(args: argparse.Namespace) -> int:
    from xla_host import filemode, launch_profile

    document, _ = _document(args)
    profile = launch_profile.choose(document.profiles, args.profile, document.bundle)
    decided = _cache_role(args, os.environ)
    role = decided.role
    build = document.build_directory() if profile.needs_build else None
    out: Path = args.out or Path("out") / "launch" / document.bundle / f"{profile.name}-{role}"
    files = launch_profile.launch_files(profile, document.bundle, role, build)
    _fetch_launch_pack(args, document.bundle, profile.environment(document.bundle, role, build),
                       role)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    # One launch environment: both files or, on a failure (a full disk), neither changed.
    filemode.write_all([(out / name, text) for name, text in files.items()])
    print(f"launch profile {profile.name} of {document.bundle}, role {decided.describe()}, "
          f"written to {out}:")  # fmt: skip
    print(f"  . {shlex.quote(str(out / 'env.sh'))}    # in the launcher, before training starts")
    return 0


def _fetch_launch_pack(
    args: argparse.Namespace, bundle: str, profile_env: Mapping[str, str], role: str
) -> None:
    """``--pack-lane``: the lane's pack installed into the profile's cache directory before
    the launch files are written (a refused pack: nothing written, the pack's exit code)."""
    from xla_host import cache_command
    from xla_host.launch_profile import CACHE_PATH

    request = cache_command.pack_request(
        args.pack_lane, args.pack_workload, args.pack_public_key, os.environ
    )
    if request is None:
        return
    # The job's device and topology: the profile's settings over this host's environment.
    env = {**os.environ, **profile_env}
    fetched = cache_command.launch_pack(request, bundle, env, role, _python(args), _network(args))
    print(fetched.line() if fetched else cache_command.not_fetched(env.get(CACHE_PATH)))


def run_gate(args: argparse.Namespace) -> int:
    from xla_host import gate_end, launch_profile
    from xla_host.gate import arguments as gate_arguments
    from xla_host.gate import under_profile
    from xla_host.gate.target import default_device

    gate_arguments.checks(args.checks)  # before the lane is asked
    # Without a document (the builder's ship check judges a staging directory): verdicts
    # only, and a receipt that says it is for no bundle's wheels.
    named = args.lane or args.bundle or args.bundle_document
    document, digest = _document(args) if named else (None, None)
    profile = None
    if args.profile:
        if document is None:
            raise UsageError(
                "a launch profile belongs to a bundle: --profile needs --lane and --bundle",
                fix=f"pass --lane <lane> --bundle <bundle> with --profile {args.profile}",
            )
        chosen = launch_profile.choose(document.profiles, args.profile, document.bundle)
        profile = under_profile.plan(chosen, document.bundle, args.device or default_device())
        for line in profile.lines():
            log.info(line)
    python = _python(args)
    bundle = document.bundle if document else args.bundle
    config = gate_arguments.gate_config(args, python, profile)

    def write_receipt(outcome: GateOutcome) -> Path:
        return _write_gate_receipt(args, outcome, document, digest, profile)

    return gate_end.run_and_leave(
        args, config, bundle=bundle, network=_network(args), write_receipt=write_receipt
    )


def _write_gate_receipt(
    args: argparse.Namespace,
    outcome: GateOutcome,
    document: bundle_document.BundleDocument | None,
    digest: str | None,
    profile: GateProfile | None,
) -> Path:
    """The host's receipt of a gate run: the environment compared with the bundle
    document's files (none: a staging directory's ship check, a receipt for no bundle),
    written under ``--out``; its path."""
    if document is None:
        facts, match = installed.probe_environment(outcome.target.python, []), None
    else:
        facts, match = _compare_files(args, document, outcome.target.python)
        for problem in match.problems:
            log.warning(problem)
    receipt = receipts.receipt_from_gate(
        outcome.target,
        outcome.results,
        bundle=document.bundle if document else None,
        workload=args.workload.name,
        facts=facts,
        match=match,
    )
    receipt = replace(
        receipt,
        bundle_document=f"sha256:{digest}" if digest else None,
        profile=profile.record() if profile else None,
        slice=outcome.slice_record,
    )
    out: Path = args.out
    if document is None:
        path = receipts.write_receipt(out / "receipt.json", receipt, replace=True)
    else:
        path = receipts.write_receipt(receipts.receipt_path(out, receipt), receipt)
    print(f"receipt: {path} ({receipt_verdict.judge(receipt).gate_label})")
    return path
