"""The doctor's checks a host can make from the bundle document alone.

Versions, the installed files against the document's wheel hashes, the cache contract:
nothing here needs the checkout, and nothing imports torch_xla (the probe reads metadata
in the host's interpreter). The builder's doctor (``xla_wheels.publish.doctor``) keeps
what needs the builder's libraries (SBOM, the ABI through pyelftools, signed provenance)
and its checkout (wheels.lock, lanes.lock).

Versions are compared as exact pins, by normalized string: a training host's
environment has no ``packaging`` and must not gain it (the stock torch environment ships
none), and every version the document pins is an exact one (locked or resolved wheels).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from xla_host.bundle_document import BundleDocument
from xla_host.cache_contract import CacheFacts, Finding, judge_cache_contract
from xla_host.host_probe import HostFacts
from xla_host.installed import EnvironmentMatch
from xla_host.launch_profile import CACHE_PATH, CACHE_READ_ONLY
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


def install_fix(lane: str | None) -> str:
    where = f" --index-url {lane}" if lane else " --index-url <the lane's simple/ URL>"
    return f"install the bundle by hash: pip install --require-hashes -r requirements.txt{where}"


def check_versions(
    report: HostReport, document: BundleDocument, facts: HostFacts, fix: str
) -> None:
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


def check_files(report: HostReport, match: EnvironmentMatch, fix: str) -> None:
    """Each document wheel against the installed files, byte for byte (``installed``)."""
    for wheel in match.wheels:
        if wheel.matched:
            report.add("ok", f"files {wheel.project}", f"{wheel.files} files of {wheel.name}")
        else:
            report.add("FAIL", f"files {wheel.project}", "; ".join(wheel.problems), fix)


def check_cache(
    report: HostReport, facts: HostFacts, env: Mapping[str, str], role: str | None
) -> None:
    versions = {normalize(k): v for k, v in facts.versions.items()}
    contract = CacheFacts(
        bundle=report.bundle,
        path=env.get(CACHE_PATH) or None,
        torch_xla_version=versions.get("torch-xla"),
        libtpu_version=versions.get("libtpu"),
        role=role,
        read_only=env.get(CACHE_READ_ONLY) == "1",
    )
    report.findings += judge_cache_contract(contract)


def role_of(explicit: str | None, env: Mapping[str, str]) -> str | None:
    """``--role``, else by ``TPU_WORKER_ID`` (worker 0 writes the cache), else unknown."""
    if explicit:
        return explicit
    worker = env.get("TPU_WORKER_ID", "").strip()
    return ("writer" if int(worker) == 0 else "reader") if worker.isdigit() else None
