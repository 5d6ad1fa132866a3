"""Subcommands ``publish``, ``requirements``, ``verify-install`` and ``doctor``."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from xla_wheels import log
from xla_wheels.bundle import load_bundle
from xla_wheels.errors import UsageError
from xla_wheels.layout import BundleLayout
from xla_wheels.lockfile import read_lock
from xla_wheels.options import PipelineOptions, add_bundle_parser, options_from_args
from xla_wheels.progress import Timings, log_redactor
from xla_wheels.publish import doctor, requirements, upload, verify_install
from xla_wheels.publish.static_index import write_static_index
from xla_wheels.publish.wheels import locked_records, locked_wheels
from xla_wheels.release import cli as release_cli


def _index_url(args: argparse.Namespace) -> str | None:
    # INDEX_URL is a URL, never a secret: credentials come from TWINE_* or keyring.
    return args.index_url or os.environ.get("INDEX_URL") or None


def _dist(options: PipelineOptions, args: argparse.Namespace) -> Path:
    return BundleLayout.of(options, args.bundle, dist_root=args.dist_dir).dist


def cmd_publish(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    load_bundle(options.root, args.bundle)  # an unknown bundle fails with the valid names
    # Its own log next to the build's (out/<bundle>/logs/publish.log), credentials in URLs
    # and TWINE_PASSWORD masked, and its row in a timings table, also when it fails.
    logs = BundleLayout.of(options, args.bundle).logs
    secrets = {key: os.environ[key] for key in ("TWINE_PASSWORD",) if os.environ.get(key)}
    timings = Timings()
    try:
        with log.stage_log(logs / "publish.log", log_redactor(secrets)), timings.stage("publish"):
            result = upload.publish(
                options.lock_path,
                args.bundle,
                _dist(options, args),
                _index_url(args),
                args.upload_url,
            )
    finally:
        timings.report()
    for outcome in result.outcomes:
        print(f"{outcome.action:<9} {outcome.filename}  sha256:{outcome.sha256}")
    print(f"index: {result.index_url}")
    if not _index_url(args):
        print(
            f"install on a host: pip install --require-hashes --index-url {result.index_url} "
            f"-r <requirements> (make requirements BUNDLE={args.bundle})"
        )
    return 0


def cmd_requirements(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    bundle = load_bundle(options.root, args.bundle)
    directory = _dist(options, args)
    wheels = locked_wheels(options.lock_path, bundle.name, directory)
    platforms = args.platform or requirements.host_platforms()
    runtime = requirements.runtime_records(
        options.lock_path, bundle, wheels, platforms, refresh=args.refresh
    )
    output = args.output or directory / requirements.REQUIREMENTS_NAME
    path = requirements.write_requirements(output, bundle, [w.record for w in wheels], runtime)
    print(f"wrote {path}: {len(wheels)} wheel(s) of ours, {len(runtime)} public wheel(s)")
    return 0


def cmd_verify_install(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    bundle = load_bundle(options.root, args.bundle)
    index_url = _index_url(args)
    if not index_url:
        directory = _dist(options, args)
        wheels = locked_wheels(options.lock_path, bundle.name, directory)
        index_url = write_static_index(directory, wheels).resolve().as_uri() + "/"
        log.info(f"no INDEX_URL: installing from the static index {index_url}")
    else:
        locked_records(options.lock_path, bundle.name)
    report = verify_install.verify_install(
        lock_path=options.lock_path,
        bundle=bundle,
        index_url=index_url,
        work=BundleLayout.of(options, bundle.name).verify_install,
        base_python=args.python or sys.executable,
        no_deps=args.no_deps,
        deps_from=args.deps_from,
        require_provenance=args.require_provenance,
    )
    print(report.render())
    verify_install.ensure_passed(report)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    bundle = load_bundle(options.root, args.bundle)
    python = args.python or shutil.which("python3") or sys.executable
    entry = read_lock(options.lock_path).bundles.get(bundle.name)
    report = doctor.run_doctor(bundle, python, entry, os.environ, args.role, args.cache_path)
    release_cli.add_lane_findings(report, options.root, python, args.lane, bundle.name)
    print(report.render())
    doctor.ensure_healthy(report)
    return 0


def _role(value: str) -> str:
    if value not in doctor.ROLES:
        raise UsageError(f"unknown role {value!r}", fix="use writer or reader")
    return value


def _add_dist(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dist-dir", type=Path, default=None, help="where wheels are (default: <root>/dist)"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_bundle_parser(
        subparsers,
        "publish",
        "upload the bundle's locked wheels to a PEP 503 index with twine (or, without "
        "--index-url, write a static index in dist/<bundle>/simple/)",
    )
    _add_dist(parser)
    parser.add_argument(
        "--index-url",
        default=None,
        help="the index's simple/ URL (default: $INDEX_URL; none: static index). "
        "Credentials: TWINE_USERNAME/TWINE_PASSWORD or keyring, never in the URL",
    )
    parser.add_argument(
        "--upload-url",
        default=os.environ.get("UPLOAD_URL") or None,
        help="twine's --repository-url (default: $UPLOAD_URL, else INDEX_URL without "
        "its trailing simple/)",
    )
    parser.set_defaults(handler=cmd_publish)

    parser = add_bundle_parser(
        subparsers,
        "requirements",
        "write the hash-pinned requirements file hosts install the bundle from",
    )
    _add_dist(parser)
    parser.add_argument(
        "--output", type=Path, default=None, help="default: dist/<bundle>/requirements.txt"
    )
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="resolve the public wheels again even if wheels.lock has them",
    )
    parser.add_argument(
        "--platform",
        action="append",
        default=None,
        help="platform tag of the hosts (repeatable; default: manylinux_2_35..2_17 and "
        "linux, x86_64)",
    )
    parser.set_defaults(handler=cmd_requirements)

    parser = add_bundle_parser(
        subparsers,
        "verify-install",
        "install the bundle by hash into a fresh venv from the index, check versions and "
        "provenance against wheels.lock, import torch_xla",
    )
    _add_dist(parser)
    parser.add_argument(
        "--index-url", default=None, help="simple/ URL (default: $INDEX_URL, else the static index)"
    )
    parser.add_argument(
        "--python",
        default=os.environ.get("PYTHON") or None,
        help="base interpreter of the venv (default: this one)",
    )
    parser.add_argument(
        "--no-deps",
        action="store_true",
        default=os.environ.get("NO_DEPS", "") in ("1", "true", "yes"),
        help="install only our wheels, with pip --no-deps ($NO_DEPS=1)",
    )
    parser.add_argument(
        "--deps-from",
        default=os.environ.get("DEPS_FROM") or None,
        help="python of an environment whose packages (torch) the import " "may use ($DEPS_FROM)",
    )
    parser.add_argument(
        "--require-provenance",
        action="store_true",
        help="fail when the installed torch_xla has no provenance file",
    )
    parser.set_defaults(handler=cmd_verify_install)

    parser = add_bundle_parser(
        subparsers,
        "doctor",
        "check a training host against a bundle (versions, runtime flags, cache) without "
        "importing torch_xla",
    )
    parser.add_argument(
        "--python",
        default=os.environ.get("PYTHON") or None,
        help="the training environment's python (default: python3 on PATH)",
    )
    parser.add_argument(
        "--role",
        type=_role,
        default=os.environ.get("ROLE") or None,
        help="writer or reader of a shared cache (default: from TPU_WORKER_ID, " "worker 0 writes)",
    )
    parser.add_argument("--lane", default=os.environ.get("LANE") or None,
                        help="the lane this host belongs to ($LANE)")  # fmt: skip
    parser.add_argument(
        "--cache-path",
        default=None,
        help="judge this compilation cache path (default: XLA_PERSISTENT_CACHE_PATH)",
    )
    parser.set_defaults(handler=cmd_doctor)
