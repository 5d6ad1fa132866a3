"""The compilation-cache part of the runtime contract, as pure functions.

Why the cache directory must be specific to the installed build: torch_xla's cache key
(``PjRtComputationClient::HashCompilationEnv`` at c04e61c) covers the graph, the devices
and the torch / torch_xla git revisions compiled into ``_XLAC``, but not the patch series
applied on top of the pinned commit (a patched build has the pin's revision), and on TPU
it hashes the serialized topology without ``platform_version()``, so the libtpu version
may not be in it. Two builds, or two libtpu versions (users run 0.0.36 and 0.0.37 side by
side), sharing one directory could load each other's executables. A directory whose name
carries the full torch_xla version (public version and local label: the label ``+git<sha7>
.p<series digest>`` names the patch series) and the libtpu version cannot.

Readers: on a multi-host mount one host writes and every other host runs with
``XLA_PERSISTENT_CACHE_READ_ONLY=1``; a host whose role is ``reader`` must be read-only
and the writer must not be.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

#: Parent of the recommended directory when the host has no cache path yet.
DEFAULT_ROOT = "/mnt/xla-cache"
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


@dataclass(frozen=True)
class CacheFacts:
    """What the contract is judged on, gathered by the caller (environment, metadata)."""

    bundle: str
    path: str | None
    torch_xla_version: str | None
    libtpu_version: str | None
    role: str | None
    read_only: bool
    role_reason: str | None = None
    """How the role was decided (``TPU_WORKER_ID=3``: :mod:`xla_host.cache_role`)."""


@dataclass(frozen=True)
class Finding:
    """One line of doctor's report (this contract's findings are some of them)."""

    status: str
    """``ok``, ``WARN`` or ``FAIL``."""
    check: str
    detail: str
    fix: str = ""


def directory_name(bundle: str, torch_xla_version: str, libtpu_version: str | None) -> str:
    """``xla_cache_<bundle>_txla<full torch_xla version>[_libtpu<version>]``."""
    name = f"xla_cache_{bundle}_txla{torch_xla_version}"
    if libtpu_version:
        name += f"_libtpu{libtpu_version}"
    return _UNSAFE.sub("_", name)


def recommended_path(facts: CacheFacts) -> str | None:
    """The path to use: next to the current cache directory, or under ``DEFAULT_ROOT``."""
    if not facts.torch_xla_version:
        return None
    name = directory_name(facts.bundle, facts.torch_xla_version, facts.libtpu_version)
    if facts.path:
        current = PurePosixPath(facts.path)
        if current.name == name:
            return str(current)
        return str(current.parent / name)
    return str(PurePosixPath(DEFAULT_ROOT) / name)


def missing_from_path(path: str, torch_xla_version: str, libtpu_version: str | None) -> list[str]:
    """Which parts of the build's identity the path does not name."""
    public, _, label = torch_xla_version.partition("+")
    missing = []
    if public not in path:
        missing.append(f"the torch_xla version {public}")
    if label and label not in path:
        missing.append(f"the torch_xla local label +{label} (it names the patch series)")
    if libtpu_version and libtpu_version not in path:
        missing.append(f"the libtpu version {libtpu_version}")
    return missing


def judge_cache_contract(facts: CacheFacts) -> list[Finding]:
    findings: list[Finding] = []
    recommended = recommended_path(facts)
    export = f"export XLA_PERSISTENT_CACHE_PATH={recommended}" if recommended else ""
    if facts.torch_xla_version is None:
        findings.append(
            Finding("WARN", "cache path build", "torch_xla is not installed: no build to match")
        )
    elif facts.path:
        missing = missing_from_path(facts.path, facts.torch_xla_version, facts.libtpu_version)
        if missing:
            findings.append(
                Finding(
                    "FAIL",
                    "cache path build",
                    f"{facts.path} does not name {', '.join(missing)}: another build or "
                    "libtpu could load executables from it",
                    export,
                )
            )
        else:
            findings.append(Finding("ok", "cache path build", f"{facts.path} names this build"))
    if facts.libtpu_version is None and facts.torch_xla_version is not None:
        findings.append(
            Finding(
                "WARN",
                "cache path libtpu",
                "libtpu is not installed: the path cannot name it (not a TPU host?)",
            )
        )
    role = f"{facts.role} ({facts.role_reason})" if facts.role_reason else facts.role
    if facts.role == "reader" and not facts.read_only:
        findings.append(
            Finding(
                "FAIL",
                "cache role",
                f"this host is a {role} but XLA_PERSISTENT_CACHE_READ_ONLY is not 1",
                "export XLA_PERSISTENT_CACHE_READ_ONLY=1",
            )
        )
    elif facts.role == "writer" and facts.read_only:
        findings.append(
            Finding(
                "FAIL",
                "cache role",
                f"this host is the {role} but XLA_PERSISTENT_CACHE_READ_ONLY=1",
                "unset XLA_PERSISTENT_CACHE_READ_ONLY on the one writer host",
            )
        )
    elif facts.role is not None:
        mode = "read-only" if facts.read_only else "writes"
        findings.append(Finding("ok", "cache role", f"{role}, {mode}"))
    if recommended:
        findings.append(Finding("ok", "cache path recommended", recommended))
    return findings
