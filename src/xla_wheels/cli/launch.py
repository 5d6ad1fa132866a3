"""``xla-wheels launch-env``: a bundle's launch profile written for a launcher.

Writes, into ``--out`` (default ``<out>/launch/<bundle>/<profile>-<role>/``):

- ``env.sh``: ``export NAME='value'`` lines a POSIX shell sources (values quoted with
  ``shlex.quote``, so a flag string or a path with spaces stays one value);
- ``env.json``: the same environment with the bundle, profile, its digest and role, which
  ``scripts/xla_launch_profile.py`` applies before ``import torch_xla``;
- ``xla_launch_profile.py``: a copy of that helper, so the directory is all a host needs.

With ``--pack-lane`` (or ``XLA_WHEELS_PACK_LANE``), the lane's signed cache pack for the
bundle, ``--pack-workload`` and this host's topology is fetched by hash, verified and
installed into the profile's ``XLA_PERSISTENT_CACHE_PATH`` first (a writer only: a reader
says so and writes nothing), by the same function as ``xla-host cache fetch``
(:func:`xla_host.cache_command.fetch_pack`); this interpreter's torch_xla is the one the
pack must match.

Exit 0 written; 1 the pack was refused (nothing installed, nothing written); 2 an unknown
bundle, profile or role (the fix names the valid ones), a pack without its key; 8 the
lane did not answer in time; 10 a disk fault.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from xla_host import cache_command, cache_role, filemode, launch_profile, log
from xla_host.cache_contract import directory_name
from xla_host.errors import UsageError
from xla_host.launch_profile import CACHE_PATH
from xla_host.tables import read_regular
from xla_wheels.bundle import Bundle, load_bundle
from xla_wheels.cli.arguments import add_bundle_arguments
from xla_wheels.cli.settings import pipeline_options
from xla_wheels.publish.wheels import locked_versions
from xla_wheels.settings_rows import add_settings
from xla_wheels.wheels_lock import read_lock

HELPER = Path("scripts") / "xla_launch_profile.py"


def cmd_launch_env(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    bundle = load_bundle(options.root, args.bundle)
    profile = launch_profile.choose(bundle.profiles, args.profile, bundle.name)
    # The one rule (xla_host.cache_role), as doctor and the host's launch-env decide it.
    decided = cache_role.decide(args.role, os.environ)
    if decided.warning:
        log.warning(decided.warning)
    role = decided.role
    build = _build_directory(options.lock_path, bundle) if profile.needs_build else None
    out: Path = args.out or options.out_dir / "launch" / bundle.name / f"{profile.name}-{role}"
    files: list[tuple[Path, bytes | str]] = [
        (out / name, text)
        for name, text in launch_profile.launch_files(profile, bundle.name, role, build).items()
    ]
    files.append((out / HELPER.name, _helper(options.root)))
    # --pack-lane: the host's own opt-in (xla_host.cache_command), the same fetch, before
    # anything is written: a refused pack leaves the launch files as they were.
    request = cache_command.pack_request(
        args.pack_lane, args.pack_workload, args.pack_public_key, os.environ
    )
    if request is not None:
        env = {**os.environ, **profile.environment(bundle.name, role, build)}
        fetched = cache_command.launch_pack(
            request, bundle.name, env, role, Path(sys.executable), options.network
        )
        print(fetched.line() if fetched else cache_command.not_fetched(env.get(CACHE_PATH)))
    out.mkdir(parents=True, exist_ok=True)
    # The three files are one launch environment: all of them or, on a failure (a full
    # disk), none changed.
    filemode.write_all(files)
    print(f"launch profile {profile.name} of {bundle.name}, role {decided.describe()}, written "
          f"to {out}:")  # fmt: skip
    # Lines to copy: the path quoted for the shell, and as a Python string literal.
    env_sh, env_json = shlex.quote(str(out / "env.sh")), repr(str(out / "env.json"))
    print(f"  . {env_sh}    # in the launcher, before the training process starts")
    print(f"  xla_launch_profile.apply({env_json})    # or first thing in training code")
    return 0


def _helper(root: Path) -> bytes:
    """The helper launch-env copies beside the env files, read before anything is written."""
    path = root / HELPER
    try:
        return read_regular(path, UsageError, what="launch helper")
    except FileNotFoundError:
        raise UsageError(
            f"{path} does not exist: the project root {root} has no launch helper to copy "
            "beside the environment files",
            fix=f"run from a full checkout of the project (or pass --root one), or restore "
            f"it: `git checkout -- {HELPER}`",
        ) from None


def _build_directory(lock_path: Path, bundle: Bundle) -> str:
    """``{build}`` of the cache path: the cache contract's directory name for the torch_xla
    wheel wheels.lock records and the libtpu version hosts install."""
    entry = read_lock(lock_path).bundles.get(bundle.name)
    version = locked_versions(entry.wheels or () if entry else ()).get("torch-xla")
    if version is None:
        raise UsageError(
            f"the cache path of this profile names the build ({{build}}), and wheels.lock "
            f"records no torch_xla wheel for {bundle.name}",
            fix=f"build it first (`make wheels BUNDLE={bundle.name}`), or launch with a "
            "profile whose cache path does not use {build}",
        )
    libtpu = bundle.runtime.get("libtpu")
    return directory_name(bundle.name, version, libtpu.install_version if libtpu else None)


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Define launch-env's arguments on ``parser`` and set its handler."""
    add_bundle_arguments(parser, writes_bundle=False)  # writes out/launch/<bundle>
    add_settings(
        parser, name, "--profile", "--role", "--out",
        "--pack-lane", "--pack-workload", "--pack-public-key",
    )  # fmt: skip
    parser.set_defaults(handler=cmd_launch_env)
