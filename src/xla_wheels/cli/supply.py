"""Subcommands ``attest`` and ``rebuild-check`` (supply-chain evidence).

Exit codes: 0 done (attest) or the rebuild is identical (rebuild-check); 1 a rebuilt
wheel differs from the recorded one (diffoscope's report is kept), or a build failed;
2 bad input (unknown bundle, no signing key, a key file that is not a PEM key).
"""

from __future__ import annotations

import argparse
import os

from xla_host.errors import UsageError
from xla_wheels.cli.arguments import add_bundle_arguments
from xla_wheels.cli.settings import build_config, pipeline_options, supply_options
from xla_wheels.layout import BundleLayout
from xla_wheels.options import env_var
from xla_wheels.settings_rows import add_settings
from xla_wheels.wheels_lock import read_lock


def cmd_attest(args: argparse.Namespace) -> int:
    from xla_wheels import attestation as attest

    options = pipeline_options(args, os.environ)
    settings = supply_options(args, os.environ)
    bundle = args.loaded_bundle  # loaded once, at the CLI edge (cli/bundle_lock.py)
    if settings.signing_key is None:
        raise UsageError(
            "no signing key: attestations are signed with the team's private key",
            fix=f"set {env_var('--signing-key')} to its PEM file (make: SIGNING_KEY=<file>); "
            'docs/supply-chain.md "Signed attestations" says how the team makes one',
        )
    signer = attest.load_signer(settings.signing_key)
    dist = BundleLayout.of(options, bundle.name).dist
    written = attest.attest_bundle(
        read_lock(options.lock_path), bundle, dist, signer, settings.builder_id
    )
    for path in written:
        print(f"signed     {path}")
    print(f"builder {settings.builder_id}; verify with the team's public key (make doctor)")
    return 0


def cmd_rebuild_check(args: argparse.Namespace) -> int:
    from xla_wheels import rebuild_check as rebuild

    options = pipeline_options(args, os.environ)
    config = build_config(args, os.environ)
    comparisons = rebuild.rebuild_check(options, args.loaded_bundle, config)
    for c in comparisons:
        verdict = "identical" if c.identical else "DIFFERS"
        print(f"{verdict:<10} {c.recorded}  sha256:{c.recorded_sha256}")
        if not c.identical:
            print(f"           rebuilt {c.rebuilt}  sha256:{c.rebuilt_sha256}")
            print(f"           first difference: {c.first_difference}")
            if c.report:
                print(f"           diffoscope report: {c.report}")
    rebuild.ensure_identical(args.bundle, comparisons)
    print(f"rebuild of {args.bundle}: every wheel is byte-identical to wheels.lock")
    return 0


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    add_bundle_arguments(parser, writes_bundle=True)
    if name == "rebuild-check":
        from xla_wheels.cli.stages import add_build_arguments

        add_build_arguments(parser, name)
        parser.set_defaults(handler=cmd_rebuild_check)
    else:  # attest: COMMANDS names this module for these two only
        add_settings(parser, name, "--signing-key", "--builder-id")
        parser.set_defaults(handler=cmd_attest)
