"""``doctor``: is this training host set up for the bundle, before torch_xla is imported?

Everything here is read without importing torch_xla: the runtime flags only take effect
if they are set before that import, so a doctor that imported it would be checking a
process that is already configured. The ABI check reads ``_XLAC`` and torch's libraries
as ELF files (``xla_wheels.abi``). Versions come from ``importlib.metadata`` in the
host's interpreter (``--python``), the provenance file and each wheel's SBOM
(``sbom``) are read as files, and the environment checks read this process's
environment (the shell's, through make). With the team's public key, each locked wheel's
signed attestation is verified (``attestation``, from the CLI).

The runtime contract (the users' validated receipts): ``PJRT_DEVICE=TPU``,
``XLA_NO_SPECIAL_SCALARS=1``, ``XLA_PERSISTENT_CACHE_PATH`` set to a usable directory, and
on a cache mount shared by several hosts exactly one writer, every other host with
``XLA_PERSISTENT_CACHE_READ_ONLY=1``; a cache directory specific to the installed build
and libtpu version (``cache_contract``), and the path doctor recommends.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from xla_host.cache_contract import CacheFacts, judge_cache_contract
from xla_host.errors import LockError, PipelineError
from xla_host.host_doctor import PACKAGES, Report
from xla_host.host_probe import HostFacts, probe
from xla_host.provenance import Provenance, ProvenanceFormatError
from xla_host.wheel_filename import normalize
from xla_wheels import sbom
from xla_wheels.abi import pairs as abi_pairs
from xla_wheels.bundle import Bundle
from xla_wheels.disk_faults import mount_of
from xla_wheels.publish import provenance_check as prov
from xla_wheels.publish.errors import DoctorFailed
from xla_wheels.publish.wheels import locked_sboms, locked_versions
from xla_wheels.wheels_lock import BundleEntry, Lock

#: File system types on which several hosts see the same cache directory.
SHARED_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "lustre",
        "ceph",
        "glusterfs",
        "fuse.gcsfuse",
        "fuse.sshfs",
        "9p",
        "virtiofs",
        "beegfs",
        "gpfs",
    }
)


@dataclass
class DoctorReport(Report):
    """The builder's doctor: the host's findings, and those only the checkout can make."""

    host: HostFacts | None = None
    """What the host probe read (versions, provenance), for findings added after the run."""


def meets_minimum(installed: str, minimum: str) -> bool:
    """What pip's ``>=minimum`` says of ``installed``: a pre-release of the minimum (a
    ``.dev`` build) is older than it. An installed version that is no PEP 440 version
    meets no minimum."""
    try:
        return SpecifierSet(f">={minimum}").contains(installed, prereleases=True)
    except InvalidSpecifier:
        return False


def expected_versions(bundle: Bundle, lock_entry: BundleEntry | None) -> dict[str, str]:
    """Exact versions of our packages: the locked wheels', else the manifest's public one."""
    expected = locked_versions((lock_entry.wheels or ()) if lock_entry else ())
    for component in ("torch", "torch_xla"):
        version = bundle.components[component].version
        if version:
            expected.setdefault(normalize(component), version)
    return expected


def check_versions(report: DoctorReport, bundle: Bundle, facts: HostFacts, lock: Lock) -> None:
    installed = {normalize(k): v for k, v in facts.versions.items()}
    fix_install = (
        f"install the bundle: `make requirements BUNDLE={bundle.name}`, then "
        "`pip install --require-hashes --extra-index-url <INDEX_URL> -r requirements.txt`"
    )
    if facts.version != bundle.python:
        report.add(
            "WARN",
            "python",
            f"{facts.version}, bundle is built for " f"{bundle.python}",
            f"use a Python {bundle.python} environment",
        )
    for project, want in sorted(expected_versions(bundle, lock.bundles.get(bundle.name)).items()):
        have = installed.get(project)
        if have is None:
            report.add("FAIL", project, f"not installed (bundle: {want})", fix_install)
        elif have == want:
            report.add("ok", project, have)
        elif "+" not in want and have.split("+", 1)[0] == want:
            report.add("ok", project, f"{have} (bundle pins {want}; no wheels locked yet)")
        else:
            report.add("FAIL", project, f"{have} installed, bundle has {want}", fix_install)
    for pin in bundle.runtime.values():
        have = installed.get(normalize(pin.name))
        if have is None:
            report.add("FAIL", pin.name, f"not installed (bundle: {pin.specifier})", fix_install)
        elif pin.version is not None:
            ok = have == pin.version
            report.add(
                "ok" if ok else "FAIL",
                pin.name,
                f"{have} (bundle: =={pin.version})",
                "" if ok else fix_install,
            )
        elif not meets_minimum(have, pin.minimum or "0"):
            report.add(
                "FAIL", pin.name, f"{have} is older than the minimum {pin.minimum}", fix_install
            )
        elif pin.preferred and have != pin.preferred:
            report.add(
                "WARN",
                pin.name,
                f"{have} (>= {pin.minimum}; preferred {pin.preferred})",
                f"pip install libtpu=={pin.preferred} (the validated version)",
            )
        else:
            report.add("ok", pin.name, have)
    try:
        provenance = facts.provenance()
    except ProvenanceFormatError as error:
        report.add(
            "FAIL",
            "provenance",
            f"{facts.provenance_path} does not follow the schema: {error}",
            f"install the bundle's patched torch_xla (`make wheels BUNDLE={bundle.name}`)",
        )
        provenance = None
    else:
        if provenance is None and installed.get("torch-xla"):
            report.add(
                "WARN",
                "provenance",
                "the installed torch_xla has no provenance file "
                "(a stock wheel, or built before provenance was written)",
                "install the bundle's patched torch_xla",
            )
    if provenance is not None:
        check_provenance(report, bundle, provenance, lock, fix_install)
    entry = lock.bundles.get(bundle.name)
    locked = locked_sboms(entry.wheels or ()) if entry is not None else {}
    for sbom_check in sbom.check_installed(facts.python, provenance, locked=locked):
        fix = "" if sbom_check.status == "ok" else fix_install
        report.add(sbom_check.status, f"sbom {sbom_check.project}", sbom_check.detail, fix)
    if facts.imported:
        report.add(
            "WARN",
            "imports",
            f"probe saw {list(facts.imported)} already imported " "(sitecustomize?)",
            "do not import torch in site hooks",
        )


def check_provenance(
    report: DoctorReport,
    bundle: Bundle,
    provenance: Provenance,
    lock: Lock,
    fix_install: str,
) -> None:
    """Judge the installed torch_xla by its inputs against the bundle's lock entry.

    Not by a bundle name: bundles with the same inputs share one wheel (builder.stamp).
    """
    try:
        lock_entry = lock.entry(bundle.name)
    except LockError as unlocked:
        detail = f"{unlocked.message}: the inputs cannot be compared"
        report.add("WARN", "provenance", detail, unlocked.fix or "")
        return
    check = prov.compare(provenance, bundle.name, lock_entry)
    if check.problems:
        report.add("FAIL", "provenance", "; ".join(check.problems), fix_install)
    elif not check.compared:
        report.add(
            "FAIL",
            "provenance",
            "present but holds none of the inputs the lock records",
            fix_install,
        )
    else:
        report.add("ok", "provenance", "inputs match wheels.lock: " + ", ".join(check.compared))


def role_of(explicit: str | None, env: Mapping[str, str]) -> tuple[str | None, str]:
    """The host's role and how it is known: ``--role``, else TPU_WORKER_ID, else None."""
    if explicit:
        return explicit, "given"
    worker = env.get("TPU_WORKER_ID")
    if worker is not None and worker.strip().isdigit():
        # Convention of the receipts: worker 0 writes the shared cache, the rest read it.
        return ("writer" if int(worker) == 0 else "reader"), f"TPU_WORKER_ID={worker}"
    return None, "unknown"


def check_environment(
    report: DoctorReport, env: Mapping[str, str], role: str | None = None,
    mountinfo: str | None = None,
) -> None:  # fmt: skip
    """The runtime environment a training host needs: the device, the scalars setting, and
    the persistent cache (set, reachable, and shared by one writer at most)."""
    _check_device(report, env)
    _check_scalars(report, env)
    cache = _cache_path(report, env)
    if cache is None:
        return
    path, read_only = cache
    _check_cache_access(report, path, read_only)
    _check_sharing(report, env, path, read_only, role, mountinfo)


def _check_device(report: DoctorReport, env: Mapping[str, str]) -> None:
    device = env.get("PJRT_DEVICE")
    if not device:
        report.add("FAIL", "PJRT_DEVICE", "not set", "export PJRT_DEVICE=TPU")
    elif device != "TPU":
        report.add(
            "WARN", "PJRT_DEVICE", f"{device} (training hosts use TPU)", "export PJRT_DEVICE=TPU"
        )
    else:
        report.add("ok", "PJRT_DEVICE", device)


def _check_scalars(report: DoctorReport, env: Mapping[str, str]) -> None:
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


def _cache_path(report: DoctorReport, env: Mapping[str, str]) -> tuple[Path, bool] | None:
    """The persistent cache directory and whether this host only reads it; None (reported)
    when there is none to check further."""
    read_only_raw = env.get("XLA_PERSISTENT_CACHE_READ_ONLY")
    read_only = read_only_raw == "1"
    if read_only_raw not in (None, "", "0", "1"):
        report.add(
            "WARN",
            "XLA_PERSISTENT_CACHE_READ_ONLY",
            f"{read_only_raw!r} is neither " "0 nor 1",
            "export XLA_PERSISTENT_CACHE_READ_ONLY=1 (readers) or unset it",
        )
    cache = env.get("XLA_PERSISTENT_CACHE_PATH")
    if not cache:
        report.add(
            "FAIL",
            "XLA_PERSISTENT_CACHE_PATH",
            "not set: every restart recompiles",
            "export XLA_PERSISTENT_CACHE_PATH=<directory> (the same on every host)",
        )
        return None
    path = Path(cache).expanduser()
    if not path.is_absolute():
        report.add(
            "WARN",
            "XLA_PERSISTENT_CACHE_PATH",
            f"{cache} is relative: it depends on " "the working directory",
            "use an absolute path",
        )
    if not path.is_dir():
        report.add(
            "FAIL",
            "XLA_PERSISTENT_CACHE_PATH",
            f"{path} does not exist or is not a " "directory",
            f"mkdir -p {path} (on the shared mount if several hosts share it)",
        )
        return None
    return path, read_only


def _check_cache_access(report: DoctorReport, path: Path, read_only: bool) -> None:
    if read_only:
        usable = os.access(path, os.R_OK | os.X_OK)
        report.add(
            "ok" if usable else "FAIL",
            "XLA_PERSISTENT_CACHE_PATH",
            f"{path} {'readable' if usable else 'NOT readable'} (read-only host)",
            "" if usable else f"grant read access to {path}",
        )
    else:
        # os.access lies on some network file systems: really write and remove a file.
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".xla-wheels-doctor-"):
                pass
            report.add("ok", "XLA_PERSISTENT_CACHE_PATH", f"{path} writable")
        except OSError as error:
            report.add(
                "FAIL",
                "XLA_PERSISTENT_CACHE_PATH",
                f"{path} not writable: " f"{error.strerror}",
                f"make {path} writable for this user, or "
                "export XLA_PERSISTENT_CACHE_READ_ONLY=1 if another host writes it",
            )


def _check_sharing(
    report: DoctorReport, env: Mapping[str, str], path: Path, read_only: bool,
    role: str | None, mountinfo: str | None,
) -> None:  # fmt: skip
    point, fstype = mount_of(path.resolve(), mountinfo)
    shared = fstype in SHARED_FS_TYPES
    host_role, why = role_of(role, env)
    where = f"{fstype} mount {point}"
    if not shared:
        if read_only:
            report.add(
                "WARN",
                "cache sharing",
                f"read-only on a local {where}: nothing ever " "writes this cache",
                "unset XLA_PERSISTENT_CACHE_READ_ONLY on a host " "with its own cache",
            )
        else:
            report.add("ok", "cache sharing", f"local {where}, this host writes")
        return
    if host_role == "writer" and read_only:
        report.add(
            "FAIL",
            "cache sharing",
            f"shared {where}; this host is the writer ({why}) "
            "but XLA_PERSISTENT_CACHE_READ_ONLY=1",
            "unset " "XLA_PERSISTENT_CACHE_READ_ONLY on the one writer host",
        )
    elif host_role == "writer":
        report.add("ok", "cache sharing", f"shared {where}; this host is the one writer ({why})")
    elif read_only:
        report.add("ok", "cache sharing", f"shared {where}; read-only reader")
    elif host_role == "reader":
        report.add(
            "FAIL",
            "cache sharing",
            f"shared {where}; this host is a reader ({why}) " "but may write",
            "export XLA_PERSISTENT_CACHE_READ_ONLY=1 on every " "host except the one writer",
        )
    else:
        report.add(
            "WARN",
            "cache sharing",
            f"shared {where}; this host writes, and only one " "host may",
            "export XLA_PERSISTENT_CACHE_READ_ONLY=1 on every host except "
            "the one writer; tell doctor with ROLE=writer|reader",
        )


def check_abi(report: DoctorReport, python: str) -> None:
    """The installed torch_xla's ``_XLAC`` against the installed torch, read as files."""
    try:
        result = abi_pairs.check_pair(abi_pairs.from_python(python))
    except abi_pairs.NoExtension as error:
        report.add("WARN", "abi", error.message, error.fix or "")
        return
    except PipelineError as error:
        report.add("FAIL", "abi", f"cannot check: {error.message}", error.fix or "")
        return
    if result.ok:
        checked = result.comparison.checked
        report.add("ok", "abi", f"{checked} symbols _XLAC imports from torch: all exported")
        return
    names = list(result.missing_libraries) + [
        readable for group in result.groups for readable, _ in group.symbols
    ]
    report.add(
        "FAIL",
        "abi",
        f"{len(names)} missing from torch (undefined symbol at import): " + "; ".join(names),
        "install the torch this torch_xla was built against, or rebuild torch_xla "
        "(details: make abi-check PYTHON=<this python>)",
    )


def check_cache_contract(
    report: DoctorReport, bundle: Bundle, facts: HostFacts, env: Mapping[str, str],
    role: str | None = None, cache_path: str | None = None,
) -> None:  # fmt: skip
    """The cache directory names this build and libtpu; readers are read-only.

    A role the read-only switch contradicts on a shared mount is already the "cache
    sharing" failure, which names the mount and how the role is known: not judged twice.
    """
    versions = facts.versions
    told = any(f.check == "cache sharing" and f.status == "FAIL" for f in report.findings)
    contract = CacheFacts(
        bundle=bundle.name,
        path=cache_path or env.get("XLA_PERSISTENT_CACHE_PATH") or None,
        torch_xla_version=versions.get("torch_xla"),
        libtpu_version=versions.get("libtpu"),
        role=None if told else role_of(role, env)[0],
        read_only=env.get("XLA_PERSISTENT_CACHE_READ_ONLY") == "1",
    )
    report.findings += judge_cache_contract(contract)


def run_doctor(
    bundle: Bundle, python: str, lock: Lock,
    env: Mapping[str, str], role: str | None = None, cache_path: str | None = None,
) -> DoctorReport:  # fmt: skip
    report = DoctorReport(bundle.name, python)
    # The environment first: it must be right before anything imports torch_xla.
    check_environment(report, env, role)
    facts = probe(python, PACKAGES, fix="pass PYTHON=<the training environment's python>")
    report.host = facts
    check_versions(report, bundle, facts, lock)
    check_abi(report, python)
    check_cache_contract(report, bundle, facts, env, role, cache_path)
    return report


def ensure_healthy(report: DoctorReport) -> None:
    if report.failed:
        raise DoctorFailed(
            f"doctor found {len(report.failed)} problem(s): "
            + ", ".join(f.check for f in report.failed),
            fix="apply the fixes listed above, then run `make doctor BUNDLE="
            f"{report.bundle}` (with the same PYTHON=, ROLE=, ...) again",
        )
