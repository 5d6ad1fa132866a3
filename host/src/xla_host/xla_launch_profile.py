#!/usr/bin/env python3
"""Apply a bundle's launch profile to this process, before torch_xla is imported.

Training code, as its first lines (``launch-env`` wrote ``env.json`` and a copy of
this file into one directory)::

    import xla_launch_profile
    xla_launch_profile.apply("launch/env.json")   # refuses if torch_xla is imported already

    import torch_xla                               # now reads the profile's environment

torch_xla reads PJRT_DEVICE, the cache path, XLA_FLAGS and LIBTPU_INIT_ARGS when it is
imported (``torch_xla/__init__.py`` even rewrites the two flag strings then) and at
first device use, so a setting applied later is ignored or half-applied, silently. That
is why :func:`apply` refuses, with :class:`ProfileAppliedTooLate`, when ``torch_xla`` (or
any ``torch_xla.*`` module) is in ``sys.modules``: the pre-import rule made checkable.

It refuses too (:class:`ProfileConflict`) when the environment already sets one of the
profile's variables to another value, or sets a variable that torch_xla hashes into its
compile cache's key (XLA_FLAGS, LIBTPU_INIT_ARGS, TPU_MEGACORE, XLA_HLO_DEBUG,
XLA_IR_DEBUG) that the profile does not set: silently overriding a launcher's setting,
or silently keeping it, would both make this process compile (and cache) another
program than the profile's. ``replace=True`` lets the profile win and unsets such extra
cache-key variables instead.

Command line, to check a launcher's environment without starting training::

    python xla_launch_profile.py launch/env.json     # exit 0 same, 1 differs, 2 unusable

Self-contained on purpose: standard library only, so it can be copied next to training
code and needs nothing from the pipeline package (nor from ``xla_host``, whose wheel
carries this one copy: ``xla-host launch-env`` and ``xla-wheels launch-env`` both write it
beside ``env.json``; ``scripts/xla_launch_profile.py`` of the checkout links to it). It is
not shipped inside the torch_xla wheel because importing any ``torch_xla.<module>`` first
runs ``torch_xla/__init__.py``, which is exactly the import this must come before.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

#: What torch_xla (c04e61c, runtime/env_hash.cpp) hashes into the compile cache's key.
CACHE_KEY_VARIABLES = (
    "XLA_FLAGS",
    "LIBTPU_INIT_ARGS",
    "TPU_MEGACORE",
    "XLA_HLO_DEBUG",
    "XLA_IR_DEBUG",
)


class ProfileError(RuntimeError):
    """The profile cannot be applied; the message says why and what to do."""


class ProfileAppliedTooLate(ProfileError):
    """torch_xla was imported before the profile was applied."""


class ProfileConflict(ProfileError):
    """The environment already disagrees with the profile."""


def read_profile(path: str | os.PathLike[str]) -> dict[str, object]:
    """The JSON file ``make launch-env`` wrote."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ProfileError(f"{path} is not a readable launch profile: {error}") from error
    if not isinstance(data, dict) or not isinstance(data.get("environment"), dict):
        raise ProfileError(f"{path} has no 'environment' object: write it with `make launch-env`")
    return data


def _torch_xla_modules(modules: Mapping[str, object]) -> list[str]:
    return sorted(name for name in modules if name == "torch_xla" or name.startswith("torch_xla."))


def conflicts(environment: Mapping[str, str], environ: Mapping[str, str]) -> list[str]:
    """Lines naming each way ``environ`` disagrees with the profile's ``environment``."""
    lines = []
    for name, value in sorted(environment.items()):
        if name in environ and environ[name] != value:
            lines.append(f"{name}={environ[name]!r} is set; the profile says {value!r}")
    for name in CACHE_KEY_VARIABLES:
        if name in environ and name not in environment:
            lines.append(
                f"{name}={environ[name]!r} is set but not in the profile "
                "(it is in the compile cache's key)"
            )
    return lines


def apply(
    path: str | os.PathLike[str],
    *,
    replace: bool = False,
    environ: MutableMapping[str, str] | None = None,
    modules: Mapping[str, object] | None = None,
) -> dict[str, str]:
    """Set the profile's environment in this process; returns what it set."""
    modules = sys.modules if modules is None else modules
    environ = os.environ if environ is None else environ
    loaded = _torch_xla_modules(modules)
    if loaded:
        raise ProfileAppliedTooLate(
            f"torch_xla is already imported ({', '.join(loaded[:3])}): its runtime has read "
            "its environment, so the launch profile would be ignored or half-applied. "
            "Call xla_launch_profile.apply() before anything imports torch_xla "
            "(first lines of the entry point, before importing modules that import it)."
        )
    data = read_profile(path)
    environment = {str(k): str(v) for k, v in dict(data["environment"]).items()}  # type: ignore[call-overload]
    found = conflicts(environment, environ)
    if found and not replace:
        raise ProfileConflict(
            f"the environment disagrees with launch profile {data.get('profile')} of bundle "
            f"{data.get('bundle')}:\n  " + "\n  ".join(found) + "\n"
            "Unset those in the launcher (or source env.sh instead of setting them), or pass "
            "replace=True to let the profile win."
        )
    for name in CACHE_KEY_VARIABLES:
        if name not in environment:
            environ.pop(name, None)
    environ.update(environment)
    return environment


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: xla_launch_profile.py <env.json>", file=sys.stderr)
        return 2
    try:
        data = read_profile(args[0])
    except ProfileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    environment = {str(k): str(v) for k, v in dict(data["environment"]).items()}  # type: ignore[call-overload]
    found = conflicts(environment, os.environ)
    found += [
        f"{name} is not set; the profile sets {environment[name]!r}"
        for name in sorted(environment)
        if name not in os.environ
    ]
    for line in found:
        print(line)
    if not found:
        print(f"the environment is launch profile {data.get('profile')} of {data.get('bundle')}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
