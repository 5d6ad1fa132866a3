"""Arguments and handlers of ``publish``, ``requirements``, ``verify-install`` (``doctor``
is a host command: ``xla_wheels.cli.checkout_source``).

Settings come from :mod:`xla_wheels.options` (flag, then ``XLA_WHEELS_*``, then default);
credentials never do: they come from ``TWINE_USERNAME`` / ``TWINE_PASSWORD`` or keyring.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import urllib.parse
from pathlib import Path

from xla_host import log
from xla_host.net import file_url_path
from xla_host.redact import Redactor, shown
from xla_wheels import attestation as attest
from xla_wheels.cli.arguments import add_bundle_arguments
from xla_wheels.cli.settings import pipeline_options, publish_options, supply_options
from xla_wheels.layout import BundleLayout
from xla_wheels.options import PipelineOptions
from xla_wheels.progress import Timings
from xla_wheels.publish import requirements, upload, verify_install
from xla_wheels.publish.static_index import write_static_index
from xla_wheels.publish.wheels import locked_records, locked_wheels
from xla_wheels.settings_rows import add_settings
from xla_wheels.wheels_lock import read_lock, write_with_held_back, written_on_success


def _dist(options: PipelineOptions, args: argparse.Namespace) -> Path:
    return BundleLayout.of(options, args.bundle, dist_root=args.dist_dir).dist


def cmd_publish(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    settings = publish_options(args, os.environ)
    # Its own log next to the build's (out/<bundle>/logs/publish.log), credentials in URLs
    # and TWINE_PASSWORD masked, and its row in a timings table, also when it fails.
    logs = BundleLayout.of(options, args.bundle).logs
    # twine's own credential variable (read by twine, not a setting of ours): masked in logs.
    password = os.environ.get("TWINE_PASSWORD")
    secrets = {"TWINE_PASSWORD": password} if password else {}
    with contextlib.ExitStack() as stack:
        # A dry run makes the same checks (dist/ against wheels.lock, the index's listing),
        # with no upload, no static index, no log file.
        if not options.dry_run:
            timings = Timings()
            stack.callback(timings.report)  # last, after the log is closed
            stack.enter_context(log.stage_log(logs / "publish.log", Redactor(secrets)))
            stack.enter_context(timings.stage("publish"))
        result = upload.publish(
            read_lock(options.lock_path),
            args.bundle,
            _dist(options, args),
            settings.index_url,
            settings.upload_url,
            network=options.network,
            dry_run=options.dry_run,
        )
    for outcome in result.outcomes:
        print(f"{outcome.action:<9} {outcome.filename}  sha256:{outcome.sha256}")
    print(shown(f"index: {result.index_url}"))
    if options.dry_run:
        print("DRY_RUN: nothing uploaded or written")
        return 0
    if not settings.index_url:
        print(
            shown(
                f"install on a host: pip install --require-hashes --index-url {result.index_url} "
                f"-r <requirements> (make requirements BUNDLE={args.bundle})"
            )
        )
    return 0


def cmd_requirements(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    bundle = args.loaded_bundle  # loaded once, at the CLI edge (cli/bundle_lock.py)
    directory = _dist(options, args)
    lock = read_lock(options.lock_path)  # parsed once for the whole command
    wheels = locked_wheels(lock, bundle.name, directory)
    platforms = args.platform or requirements.host_platforms()
    output = args.output or directory / requirements.REQUIREMENTS_NAME
    # A runtime resolution is recorded in wheels.lock only together with the file made
    # from it: a write that fails (a read-only dist/<bundle>) leaves the lock as it was.
    with written_on_success():
        runtime = requirements.runtime_records(
            options.lock_path,
            lock,
            bundle,
            wheels,
            platforms,
            network=options.network,
            refresh=args.refresh,
        )
        text = requirements.requirements_text(bundle, [w.record for w in wheels], runtime)
        output.parent.mkdir(parents=True, exist_ok=True)
        write_with_held_back([(output, text)])
    path = output
    print(f"wrote {path}: {len(wheels)} wheel(s) of ours, {len(runtime)} public wheel(s)")
    return 0


def cmd_verify_install(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    settings = publish_options(args, os.environ)
    bundle = args.loaded_bundle  # loaded once, at the CLI edge (cli/bundle_lock.py)
    lock = read_lock(options.lock_path)  # parsed once for the whole command
    index_url = settings.index_url
    if not index_url:
        directory = _dist(options, args)
        wheels = locked_wheels(lock, bundle.name, directory)
        index = write_static_index(directory, [w.record for w in wheels])
        index_url = index.resolve().as_uri() + "/"
        log.info(f"no INDEX_URL: installing from the static index {index_url}")
    else:
        locked_records(lock, bundle.name)
    report = verify_install.verify_install(
        lock=lock,
        bundle=bundle,
        index_url=index_url,
        work=BundleLayout.of(options, bundle.name).verify_install,
        pip_cache=options.pip_cache,
        base_python=settings.python or sys.executable,
        no_deps=settings.no_deps,
        deps_from=settings.deps_from,
        require_provenance=args.require_provenance,
        network=options.network,
    )
    public_key = supply_options(args, os.environ).public_key
    if public_key is not None:
        # The installed files are the locked ones (pip --require-hashes): their envelopes.
        parts = urllib.parse.urlsplit(index_url)
        search = [_dist(options, args)]
        if parts.scheme == "file":  # a static lane: its envelopes are next to its wheels
            search.append(Path(file_url_path(index_url)).parent)
        records = locked_records(lock, bundle.name)
        locked = [(r.name, r.sha256) for r in records]
        for check in attest.signature_checks(public_key, locked, search):
            report.add(f"signature {check.wheel}", check.status, check.detail)
    print(report.render())
    verify_install.ensure_passed(report)
    return 0


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Define subcommand ``name``'s arguments on ``parser`` and set its handler."""
    handler = _HANDLERS[name]
    # Only publish has a dry run: requirements resolves and writes, verify-install
    # installs; a dry run of those would be a different command. The others write under
    # out/<bundle> or dist/<bundle> (a log, the static index, requirements.txt,
    # verify-install's venv).
    add_bundle_arguments(parser, writes_bundle=True, dry_run=name == "publish")
    add_settings(parser, name, *_FLAGS[name])
    parser.set_defaults(handler=handler)


#: Each subcommand's own flags (besides the bundle's), each a row of the settings table.
_FLAGS = {
    "publish": ("--dist-dir", "--index-url", "--upload-url"),
    "requirements": ("--dist-dir", "--output", "--refresh", "--platform"),
    "verify-install": (
        "--dist-dir", "--index-url", "--python", "--no-deps", "--deps-from",
        "--require-provenance", "--public-key",
    ),
}  # fmt: skip

_HANDLERS = {
    "publish": cmd_publish,
    "requirements": cmd_requirements,
    "verify-install": cmd_verify_install,
}
