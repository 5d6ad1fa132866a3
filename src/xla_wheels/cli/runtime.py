"""Arguments and handlers of ``runtime-image`` and ``jobs``.

``runtime-image``: an image to train from, built from a lane's current bundle
(:mod:`xla_wheels.release.runtime_image`); a dry run prints the plan and builds nothing.
``jobs``: which jobs ran a wheel, from a directory of audit stamps (:mod:`xla_host.stamp`);
reads only.

Exit codes: 0 done; 1 the engine failed to build; 2 bad input (a lane that does not serve
the bundle, an unknown profile, a stamp that is no stamp).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from xla_host import bundle_document as doc
from xla_host import launch_profile, log
from xla_host.errors import UsageError
from xla_host.filemode import file_sha256
from xla_host.net import NetworkPolicy
from xla_host.stamp import jobs_that_ran, read_stamps
from xla_wheels.bundle import load_bundle
from xla_wheels.cli.arguments import add_bundle_arguments, add_common_arguments
from xla_wheels.cli.checkout_source import CheckoutSource
from xla_wheels.cli.settings import Settings, pipeline_options
from xla_wheels.release import host_document, lanes, runtime_image
from xla_wheels.settings_rows import add_settings
from xla_wheels.wheels_lock import read_lock


def _lane_host_wheel(root: Path, lane: lanes.Lane, bundle: str) -> doc.LockedFile:
    """The host wheel ``lane``'s document of ``bundle`` pins (name, size, sha256): what
    the lane's hosts install, so what the image bakes."""
    published = host_document.published(root, lane, bundle)
    if published is None:
        raise UsageError(
            f"lane {lane.name} holds no bundle document of {bundle}, so no host wheel to bake",
            fix=f"make publish BUNDLE={bundle} LANE={lane.name} (it publishes the host wheel "
            "and the document), or pass --host-package <xla_wheels_host-*.whl> (make: "
            "HOST_PACKAGE=)",
        )
    path, sha256 = published
    document, _ = doc.read_file(path, sha256=sha256)
    if document.host_wheel is None:
        raise UsageError(
            f"lane {lane.name}'s document of {bundle} pins no host wheel (it was published "
            "without `make host-wheel`)",
            fix=f"make host-wheel, then make publish BUNDLE={bundle} LANE={lane.name}; or pass "
            "--host-package <xla_wheels_host-*.whl> (make: HOST_PACKAGE=)",
        )
    return document.host_wheel


def _fetched_host_wheel(
    lane: lanes.Lane, pinned: doc.LockedFile, into: Path, network: NetworkPolicy
) -> runtime_image.HostWheel:
    """``pinned`` fetched from ``lane`` by its sha256 (the one network client; a file of
    other bytes is never kept), into ``into``."""
    # The lane's simple/ URL, whatever its kind: a file:// one is read as its directory.
    doc.wheel_files(lane.simple_url, (pinned,), into, network=network)
    fetched = into / pinned.name
    if not fetched.is_file() or file_sha256(fetched) != pinned.sha256:
        raise UsageError(
            f"lane {lane.name} does not serve {pinned.name} with the sha256 its document pins "
            f"({pinned.sha256})",
            fix=f"publish the bundle into lane {lane.name} again (make publish), then run this "
            "again; `make status` shows what the lane serves",
        )
    return runtime_image.HostWheel(fetched, pinned.name, pinned.sha256)


def cmd_runtime_image(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    # The build's --engine row: its choices and its refusal (naming flag and variable).
    engine = str(Settings(args, os.environ).value("--engine"))
    bundle = load_bundle(options.root, args.bundle)
    if not args.profile:
        raise UsageError(
            "no launch profile given: the image bakes one profile's environment",
            fix=f"pass --profile (make: PROFILE=), one of: {', '.join(sorted(bundle.profiles))}"
            if bundle.profiles
            else f"declare [profiles.<name>] in build/bundles/{bundle.name}.toml first",
        )
    profile = launch_profile.choose(bundle.profiles, args.profile, bundle.name)
    config = lanes.load_config(options.root)
    lane = config.lane(args.lane)
    state = lanes.read_state(options.root).get(lane.name)
    entry = read_lock(options.lock_path).entry(bundle.name)
    checkout = CheckoutSource(options.root, bundle.name, args, options.out_dir, bundle)
    build = checkout.build_directory() if profile.needs_build else None
    tag = args.tag or f"localhost/xla-wheels-runtime:{bundle.name}-{lane.name}"
    # The bundle's Python (its wheels' tags), not the builder's: cp311 wheels need 3.11.
    base = args.base_image or runtime_image.default_base_image(
        runtime_image.image_python(bundle, entry)
    )
    # The host wheel the lane's hosts install (its document pins it), fetched by hash when
    # the plan runs; a given wheel or host/ source directory instead (development).
    pinned = None
    if args.host_package is None:
        pinned = _lane_host_wheel(options.root, lane, bundle.name)
        host = runtime_image.HostWheel(Path(pinned.name), pinned.name, pinned.sha256)
    else:
        host = runtime_image.given_host_wheel(args.host_package)

    def compose(host_wheel: runtime_image.HostWheel) -> runtime_image.RuntimeImagePlan:
        return runtime_image.compose(
            engine=engine, tag=tag, base_image=base, bundle=bundle, lane=lane, state=state,
            entry=entry, profile=profile, build=build, host_wheel=host_wheel,
            public_index=runtime_image.PUBLIC_INDEX,
        )  # fmt: skip

    plan = compose(host)  # checks the lane and the lock before anything is built
    if options.dry_run:
        print(plan.render(), end="")
        print("DRY_RUN: nothing built")
        return 0
    with tempfile.TemporaryDirectory(prefix="xla-wheels-runtime-") as tmp:
        context = Path(tmp)
        if pinned is not None:
            host = _fetched_host_wheel(lane, pinned, Path(tmp) / "fetched", options.network)
            plan = compose(host)
        elif host.built_from_source:
            host = runtime_image.build_host_wheel(
                sys.executable, host.source, context / "host-wheel"
            )
            plan = compose(host)
        print(plan.render(), end="")
        with log.section(f"runtime image {plan.tag} ({engine})"):
            runtime_image.execute(plan, context)
    print(f"runtime image {plan.tag}: built (entrypoint: the host check, then the command)")
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    if not args.wheel or args.stamps is None:
        raise UsageError(
            "jobs needs a wheel and a directory of stamps",
            fix="pass --wheel <file name or sha256> --stamps <dir> (make: WHEEL= STAMPS=)",
        )
    found = jobs_that_ran(read_stamps(args.stamps), args.wheel)
    if args.json:
        rows = [{"stamp": str(path), **stamp.as_json()} for path, stamp in found]
        print(json.dumps(rows, indent=2, sort_keys=True))
        return 0
    if not found:
        print(f"no stamp under {args.stamps} names {args.wheel}")
        return 0
    print(f"{len(found)} job(s) ran {args.wheel}:")
    for path, stamp in found:
        command = stamp.job.get("command", "")
        print(
            f"  {stamp.created} {stamp.host}: bundle {stamp.bundle}, lane {stamp.lane or '—'}, "
            f"profile {stamp.profile or '—'}, {stamp.verdict}"
            + (f", `{command}`" if command else "")
            + f" ({path})"
        )
    return 0


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Define subcommand ``name``'s arguments on ``parser`` and set its handler."""
    if name == "runtime-image":
        add_bundle_arguments(parser, writes_bundle=False, dry_run=True)
        add_settings(
            parser,
            name,
            "--lane",
            "--profile",
            "--engine",
            "--tag",
            "--base-image",
            "--host-package",
        )
        parser.set_defaults(handler=cmd_runtime_image)
    elif name == "jobs":
        add_common_arguments(parser)
        add_settings(parser, name, "--wheel", "--stamps", "--json")
        parser.set_defaults(handler=cmd_jobs)
    else:
        raise ValueError(f"{name} is not a subcommand of {__name__}")
