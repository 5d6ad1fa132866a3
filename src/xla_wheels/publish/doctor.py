"""``doctor``: is this training host set up for the bundle, before torch_xla is imported?

Everything here is read without importing torch_xla: the runtime flags only take effect
if they are set before that import, so a doctor that imported it would be checking a
process that is already configured. The ABI check reads ``_XLAC`` and torch's libraries
as ELF files (``xla_wheels.abi``). Versions come from ``importlib.metadata`` in the
host's interpreter (``--python``), the provenance file and each wheel's SBOM
(``sbom``) are read as files, and the environment checks read this process's
environment (the shell's, through make). With the team's public key, each locked wheel's
signed attestation is verified (``attestation``, from the CLI).

The runtime contract (the users' validated receipts): ``PJRT_DEVICE`` the bundle's
platform, ``XLA_NO_SPECIAL_SCALARS=1``, ``XLA_PERSISTENT_CACHE_PATH`` set to a usable
directory, and on a cache mount shared by several hosts exactly one writer, every other
host with ``XLA_PERSISTENT_CACHE_READ_ONLY=1``; a cache directory specific to the
installed build and libtpu version (``cache_contract``), and the path doctor recommends.
Every check of it needs no checkout and lives in the host package
(:mod:`xla_host.host_doctor`); the command itself is the host's
(:func:`xla_host.host_commands.run_doctor`, over the checkout:
``xla_wheels.cli.checkout_source``), and this module holds the checks that need the
checkout or the builder's libraries (the locked versions and provenance, the SBOM, the
ABI of the installed pair).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from xla_host.errors import LockError, PipelineError
from xla_host.host_doctor import Report
from xla_host.host_probe import HostFacts
from xla_host.provenance import Provenance, ProvenanceFormatError
from xla_host.wheel_filename import normalize
from xla_wheels import sbom
from xla_wheels.abi import pairs as abi_pairs
from xla_wheels.bundle import Bundle
from xla_wheels.publish import provenance_check as prov
from xla_wheels.publish.wheels import locked_sboms, locked_versions
from xla_wheels.wheels_lock import BundleEntry, Lock


@dataclass
class DoctorReport(Report):
    """The builder's doctor: the host's findings, and those only the checkout can make."""

    host: HostFacts | None = None
    """What the host probe read (versions, provenance), for findings added after the run."""


def meets_minimum(installed: str, minimum: str) -> bool:
    """What pip's ``>=minimum`` says of ``installed``: a pre-release of the minimum (a
    ``.dev`` build) is older than it. An installed version that is no PEP 440 version
    meets no minimum."""
    # Imported here: packaging.specifiers was the last third-party import at the start
    # of the publish commands (tests/test_cli_startup.py).
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

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
    _check_runtime_pins(report, bundle, installed, fix_install)
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


def _check_runtime_pins(
    report: DoctorReport, bundle: Bundle, installed: Mapping[str, str | None], fix_install: str
) -> None:
    """Each runtime pin (libtpu, jax...) installed, at its version or minimum."""
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
