"""The doctor's checks that need no checkout: the one copy both command lines run.

The runtime contract of this host's environment (:func:`check_environment`:
``PJRT_DEVICE`` set to the bundle's platform, ``XLA_NO_SPECIAL_SCALARS=1``, a persistent
cache path this host can use in its role, one writer on a shared mount), the cache
contract (:func:`check_cache`), and against a bundle document the versions and the
installed files (:func:`check_versions`, :func:`check_files`): nothing here needs the
checkout, and nothing imports torch_xla (the probe reads metadata in the host's
interpreter; the runtime flags only act when set before that import). ``xla-host doctor``
runs them from the lane's document; the builder's doctor (``xla_wheels.publish.doctor``)
runs the same functions and adds what needs its libraries and its checkout (the ABI of
the pair through pyelftools, the SBOM, signed provenance, wheels.lock, lanes.lock).

Versions are compared as exact pins, by normalized string: a training host's
environment has no ``packaging`` and must not gain it (the stock torch environment ships
none), and every version the document pins is an exact one (locked or resolved wheels).
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from xla_host.bundle_document import BundleDocument
from xla_host.cache_contract import CacheFacts, Finding, directory_name, judge_cache_contract
from xla_host.cache_role import CacheRole
from xla_host.filemode import mount_of
from xla_host.host_probe import HostFacts
from xla_host.installed import EnvironmentMatch
from xla_host.launch_profile import (
    CACHE_PATH,
    CACHE_READ_ONLY,
    KNOWN_VARIABLES,
    LaunchProfile,
    compare_environment,
)
from xla_host.redact import masked_url
from xla_host.wheel_filename import normalize


@dataclass
class Report:
    """A doctor's findings on this host about one bundle, printed as one table (the host's
    doctor and the builder's, which adds the SBOM, ABI and provenance findings)."""

    bundle: str
    python: str
    findings: list[Finding] = field(default_factory=list)

    def add(self, status: str, check: str, detail: str, fix: str = "") -> None:
        self.findings.append(Finding(status, check, detail, fix))

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "FAIL"]

    def title(self) -> str:
        return f"doctor: bundle {self.bundle}, python {self.python}"

    def render(self) -> str:
        lines = [self.title()]
        width = max((len(f.check) for f in self.findings), default=0)
        for finding in self.findings:
            lines.append(f"  {finding.status:<4} {finding.check:<{width}}  {finding.detail}")
            if finding.fix and finding.status != "ok":
                lines.append(f"       {'':<{width}}  fix: {finding.fix}")
        warnings = sum(f.status == "WARN" for f in self.findings)
        lines.append(f"{len(self.failed)} problem(s), {warnings} warning(s)")
        return "\n".join(lines)


@dataclass
class HostReport(Report):
    """The host's doctor: judged against a bundle document, which it names."""

    document_sha256: str = ""

    def title(self) -> str:
        return (
            f"doctor: bundle {self.bundle} (document sha256:{self.document_sha256}), "
            f"python {self.python}"
        )


#: What the probe reads besides the document's pins (the cache contract names these).
PACKAGES = ("torch", "torch_xla", "libtpu", "jax", "jaxlib")


def install_line(simple: str, requirements: str, *, host_only: bool = False) -> str:
    """One of the runbook's two install lines (docs/on-a-tpu-host.md "Runbook"): the
    training environment's wheels by hash, or (``host_only``) the host package alone,
    ``--no-deps``, so a host's own torch environment stays as it is. Credentials masked."""
    no_deps = " --no-deps" if host_only else ""
    return (
        f"pip install --require-hashes{no_deps} --index-url {masked_url(simple)} "
        f"-r {masked_url(requirements)}"
    )


def install_fix(urls: tuple[str, str, str] | None) -> str:
    """The fix of a wrong or missing wheel: the install line of the lane's ``urls``
    (``bundle_document.install_urls``: simple/, requirements.txt, host-requirements.txt),
    or its shape when the lane serves no install list (a package index: the builder's
    ``make requirements LANE=…`` writes it in the checkout)."""
    if urls is None:
        return (
            "install the bundle by hash: pip install --require-hashes --index-url "
            "<the lane's simple/ URL> -r <the lane's requirements.txt> (a package index's: "
            "dist/lanes/<lane>/requirements.txt of the builder's checkout)"
        )
    simple, requirements, _ = urls
    return f"install the bundle by hash: {install_line(simple, requirements)}"


_PINNED = re.compile(r"--hash=sha256:([0-9a-f]{64})")
_NAMED = re.compile(r"^# Hash-pinned requirements of bundle (\S+) ", re.MULTILINE)


def check_install_list(
    report: Report, document: BundleDocument, text: bytes | None, where: str
) -> None:
    """The lane's ``requirements.txt`` (``where``, masked) installs the document's bundle:
    it names that bundle and pins every wheel of the document. A list of another bundle
    (a lane moved and its list did not follow) installs other wheels than doctor judges.
    ``text`` None: the lane serves no install list (a package index): not judged here."""
    if text is None:
        return
    body = text.decode(errors="replace")
    named = _NAMED.search(body)
    bundle = named.group(1) if named else "(unnamed)"
    missing = sorted(w.name for w in document.wheels if w.sha256 not in set(_PINNED.findall(body)))
    if bundle == document.bundle and not missing:
        report.add("ok", "lane install list", f"{masked_url(where)} installs {document.bundle}")
        return
    report.add(
        "FAIL",
        "lane install list",
        f"{masked_url(where)} installs bundle {bundle}, not {document.bundle}, the document's"
        + (f" (it does not pin {', '.join(missing)})" if missing else ""),
        f"on the builder: make requirements LANE={document.lane} (writes the lane's install "
        "lists for the bundle it serves), then install again",
    )


def check_versions(report: Report, document: BundleDocument, facts: HostFacts, fix: str) -> None:
    installed = {normalize(k): v for k, v in facts.versions.items()}
    if facts.version != document.python:
        report.add(
            "WARN",
            "python",
            f"{facts.version}, the bundle is built for {document.python}",
            f"use a Python {document.python} environment",
        )
    for project, want in document.pins.items():
        have = installed.get(project)
        if have is None:
            report.add("FAIL", project, f"not installed (bundle: {want})", fix)
        elif have == want:
            report.add("ok", project, have)
        else:
            report.add("FAIL", project, f"{have} installed, the bundle has {want}", fix)
    for name, pin in sorted(document.runtime.items()):
        if pin.version is None and normalize(name) not in document.pins:
            # A minimum without a resolved file: judged by the builder's doctor (which has
            # packaging), said here rather than guessed.
            have = installed.get(normalize(name))
            report.add(
                "WARN",
                name,
                f"{have or 'not installed'} (bundle: >={pin.minimum}; not compared here: "
                "the host side compares exact pins only)",
                "resolve the runtime wheels (make requirements) so the document pins them",
            )


def check_files(report: Report, match: EnvironmentMatch, fix: str) -> None:
    """Each document wheel against the installed files, byte for byte (``installed``)."""
    for wheel in match.wheels:
        if wheel.matched:
            report.add("ok", f"files {wheel.project}", f"{wheel.files} files of {wheel.name}")
        else:
            report.add("FAIL", f"files {wheel.project}", "; ".join(wheel.problems), fix)


#: What this pipeline's bundles are built for, when no launch profile names the device.
DEFAULT_PLATFORM = "TPU"

#: File system types on which several hosts see the same cache directory.
SHARED_FS_TYPES = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "lustre", "ceph", "glusterfs", "fuse.gcsfuse",
        "fuse.sshfs", "9p", "virtiofs", "beegfs", "gpfs",
    }
)  # fmt: skip


def platform_of(profiles: Mapping[str, LaunchProfile]) -> str:
    """The platform a bundle runs on, as its document (and manifest) names it: the
    ``PJRT_DEVICE`` its launch profiles set, else :data:`DEFAULT_PLATFORM` (the wheels are
    built for Cloud TPU). Profiles that disagree name no one platform: the default."""
    named = {p.settings["PJRT_DEVICE"] for p in profiles.values() if "PJRT_DEVICE" in p.settings}
    return named.pop() if len(named) == 1 else DEFAULT_PLATFORM


def check_environment(
    report: Report, env: Mapping[str, str], role: CacheRole, *,
    platform: str = DEFAULT_PLATFORM, mountinfo: str | None = None,
) -> None:  # fmt: skip
    """The runtime flags and the cache directory of this host's environment (``env``:
    the shell's, or a launcher's env file), against the bundle's ``platform``; ``role`` as
    :func:`xla_host.cache_role.decide` decided it."""
    _check_device(report, env, platform)
    _check_scalars(report, env)
    cache = _cache_path(report, env)
    if cache is None:
        return
    path, read_only = cache
    _check_cache_access(report, path, read_only)
    _check_sharing(report, path, env, role, read_only, mountinfo)


def _check_device(report: Report, env: Mapping[str, str], platform: str) -> None:
    device = env.get("PJRT_DEVICE")
    if not device:
        report.add("FAIL", "PJRT_DEVICE", "not set", f"export PJRT_DEVICE={platform}")
    elif device.upper() != platform.upper():
        report.add(
            "FAIL",
            "PJRT_DEVICE",
            f"{device}, the bundle runs on {platform}",
            f"export PJRT_DEVICE={platform}",
        )
    else:
        report.add("ok", "PJRT_DEVICE", device)


def _check_scalars(report: Report, env: Mapping[str, str]) -> None:
    scalars = env.get("XLA_NO_SPECIAL_SCALARS")
    if scalars == "1":
        report.add("ok", "XLA_NO_SPECIAL_SCALARS", "1")
    else:
        report.add(
            "FAIL",
            "XLA_NO_SPECIAL_SCALARS",
            f"{scalars or 'not set'}, must be 1",
            "export XLA_NO_SPECIAL_SCALARS=1 (before python starts)",
        )


def _cache_path(report: Report, env: Mapping[str, str]) -> tuple[Path, bool] | None:
    """The persistent cache directory and whether this host only reads it; None (reported)
    when there is none to check further."""
    # A switch of another spelling is refused where the role is decided (cache_role).
    read_only = env.get(CACHE_READ_ONLY, "").strip() == "1"
    cache = env.get(CACHE_PATH)
    if not cache:
        report.add(
            "FAIL",
            CACHE_PATH,
            "not set: every restart recompiles",
            f"export {CACHE_PATH}=<directory> (the same on every host)",
        )
        return None
    path = Path(cache).expanduser()
    if not path.is_absolute():
        report.add(
            "WARN",
            CACHE_PATH,
            f"{cache} is relative: it depends on the working directory",
            "use an absolute path",
        )
    if not path.is_dir():
        report.add(
            "FAIL",
            CACHE_PATH,
            f"{path} does not exist or is not a directory",
            f"mkdir -p {path} (on the shared mount if several hosts share it)",
        )
        return None
    return path, read_only


def _check_cache_access(report: Report, path: Path, read_only: bool) -> None:
    if read_only:
        usable = os.access(path, os.R_OK | os.X_OK)
        report.add(
            "ok" if usable else "FAIL",
            CACHE_PATH,
            f"{path} {'readable' if usable else 'NOT readable'} (read-only host)",
            "" if usable else f"grant read access to {path}",
        )
        return
    # os.access lies on some network file systems: really write and remove a file.
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".xla-wheels-doctor-"):
            pass
        report.add("ok", CACHE_PATH, f"{path} writable")
    except OSError as error:
        report.add(
            "FAIL",
            CACHE_PATH,
            f"{path} not writable: {error.strerror}",
            f"make {path} writable for this user, or "
            f"export {CACHE_READ_ONLY}=1 if another host writes it",
        )


def _check_sharing(
    report: Report, path: Path, env: Mapping[str, str], role: CacheRole, read_only: bool,
    mountinfo: str | None,
) -> None:  # fmt: skip
    point, fstype = mount_of(path.resolve(), mountinfo)
    # A writer only by the rule's last line is not known to be the one: said below.
    host_role = None if role.by_default else role.role
    why = role.reason
    where = f"{fstype} mount {point}"
    if fstype not in SHARED_FS_TYPES:
        if read_only:
            report.add(
                "WARN",
                "cache sharing",
                f"read-only on a local {where}: nothing ever writes this cache",
                f"unset {CACHE_READ_ONLY} on a host with its own cache",
            )
        else:
            report.add("ok", "cache sharing", f"local {where}, this host writes")
        return
    if host_role == "writer" and read_only:
        report.add(
            "FAIL",
            "cache sharing",
            f"shared {where}; this host is the writer ({why}) but {CACHE_READ_ONLY}=1",
            f"unset {CACHE_READ_ONLY} on the one writer host",
        )
    elif host_role == "writer":
        report.add("ok", "cache sharing", f"shared {where}; this host is the one writer ({why})")
    elif read_only:
        report.add("ok", "cache sharing", f"shared {where}; read-only reader")
    elif host_role == "reader":
        report.add(
            "FAIL",
            "cache sharing",
            f"shared {where}; this host is a reader ({why}) but may write",
            f"export {CACHE_READ_ONLY}=1 on every host except the one writer",
        )
    else:
        report.add(
            "WARN",
            "cache sharing",
            f"shared {where}; this host writes, and only one host may",
            f"export {CACHE_READ_ONLY}=1 on every host except the one writer; tell doctor "
            "with ROLE=writer|reader (xla-host: --role)",
        )


def check_cache(
    report: Report, bundle: str, versions: Mapping[str, str | None], env: Mapping[str, str],
    role: CacheRole, cache_path: str | None = None,
) -> None:  # fmt: skip
    """The cache directory names this build and libtpu; readers are read-only.

    A role the read-only switch contradicts on a shared mount is already the "cache
    sharing" failure, which names the mount and how the role is known: not judged twice.
    """
    installed = {normalize(k): v for k, v in versions.items() if v is not None}
    told = any(f.check == "cache sharing" and f.status == "FAIL" for f in report.findings)
    contract = CacheFacts(
        bundle=bundle,
        path=cache_path or env.get(CACHE_PATH) or None,
        torch_xla_version=installed.get("torch-xla"),
        libtpu_version=installed.get("libtpu"),
        role=None if told or role.by_default else role.role,
        role_reason=role.reason,
        read_only=env.get(CACHE_READ_ONLY) == "1",
    )
    report.findings += judge_cache_contract(contract)


def check_launch_profile(
    report: Report, profile: LaunchProfile, bundle: str, env: Mapping[str, str], role: str,
    source: str, versions: Mapping[str, str | None], launch_env: str,
) -> None:  # fmt: skip
    """The launch environment (``env``, from ``source``: this host's, or a launcher's env
    file) against what ``profile`` sets for ``role``, one finding per difference (or one
    ``ok``), for every variable a profile may set (``launch_profile.KNOWN_VARIABLES``);
    PATH and the like are not launch policy. Each names the variable, the two values, and
    whether torch_xla hashes it into its compile cache's key: a host that differs there
    compiles, and caches, another program than the one the gate judged. A missing,
    different or extra setting fails, except an extra logging switch (a warning).
    ``versions``: what the host probe read (``{build}`` of the cache path);
    ``launch_env``: the command line that writes the profile's env.sh, for the fix."""
    torch_xla = versions.get("torch_xla")
    build = directory_name(bundle, torch_xla, versions.get("libtpu")) if torch_xla else None
    expected = profile.environment(bundle, role, build)
    check = f"profile {profile.name}"
    differences = compare_environment(expected, dict(env))
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
            fix + f"; or source the env.sh of `{launch_env}`",
        )
    if not differences:
        report.add(
            "ok",
            check,
            f"{source} is launch profile {profile.name} (sha256 {profile.sha256[:12]})"
            + f", role {role}",
        )
