"""Doctor's launch-profile findings: the host's launch environment against the profile.

The host's environment (or an env file a launcher sources, ``make doctor ENV_FILE=``) is
compared with what the bundle's profile sets for the host's role, variable by variable,
for every variable a profile may set (``launch_profile.KNOWN_VARIABLES``); PATH and the
like are not launch policy. Each difference is a finding that names the variable, the
two values, and whether torch_xla hashes it into its compile cache's key: a host that
differs there compiles, and caches, another program than the one the gate judged.
A missing, different or extra setting fails, except an extra logging switch (a warning).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from xla_host.cache_contract import directory_name
from xla_host.launch_profile import (
    KNOWN_VARIABLES,
    LaunchProfile,
    compare_environment,
)
from xla_wheels.publish.doctor import DoctorReport


def check_launch_profile(
    report: DoctorReport,
    profile: LaunchProfile,
    bundle: str,
    env: Mapping[str, str],
    role: str,
    source: str,
) -> None:
    """Add one finding per difference (or one ``ok``); ``source`` names where ``env`` is from."""
    expected = profile.environment(bundle, role, _installed_build(report, bundle))
    actual = dict(env)
    check = f"profile {profile.name}"
    differences = compare_environment(expected, actual)
    for difference in differences:
        quoted = shlex.quote(str(difference.expected))
        if difference.kind == "missing":
            fix = f"export {difference.variable}={quoted} in the launcher"
        elif difference.kind == "extra":
            fix = f"unset {difference.variable}, or add it to [profiles.{profile.name}."
            fix += f"{KNOWN_VARIABLES.get(difference.variable, 'device')}] and gate again"
        else:
            fix = f"export {difference.variable}={quoted}"
        report.add(
            "WARN" if difference.logging_only else "FAIL",
            check,
            f"{difference.describe()} ({source})",
            fix + f"; or source the env.sh of `make launch-env BUNDLE={bundle} "
            f"PROFILE={profile.name} ROLE={role}`",
        )
    if not differences:
        report.add(
            "ok",
            check,
            f"{source} is launch profile {profile.name} (sha256 {profile.sha256[:12]})"
            + f", role {role}",
        )


def _installed_build(report: DoctorReport, bundle: str) -> str | None:
    """``{build}`` for the torch_xla and libtpu this host has installed (None: none)."""
    versions = report.host.versions if report.host else {}
    torch_xla = versions.get("torch_xla")
    return directory_name(bundle, torch_xla, versions.get("libtpu")) if torch_xla else None
