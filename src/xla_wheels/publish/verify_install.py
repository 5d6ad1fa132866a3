"""``verify-install``: a fresh venv installs the bundle by hash and is checked.

Steps: write the hash-pinned requirements (ours from the lock, plus the recorded runtime
wheels unless ``--no-deps``), create a fresh venv, ``pip install --require-hashes
--no-cache-dir`` from the index, then in that venv compare the installed versions and the
provenance file with the lock, read each wheel's SBOM (``sbom``: in RECORD,
schema-valid, saying what the provenance says) and import torch_xla. pip refuses any
file whose sha256 is not the locked one, which is the point: a file altered on the index
never installs.

``--no-deps`` installs only our wheels (no torch/libtpu/jax download); ``--deps-from
PYTHON`` then lets the import find torch in another environment, appended after the venv's
own site-packages through a ``.pth`` file, so ``torch_xla`` still comes from the venv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.parse
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from xla_host import log, runner
from xla_host.host_probe import HostFacts, probe
from xla_host.net import TIMEOUT_SETTING, NetworkPolicy, Transient, host_of, with_retries
from xla_host.provenance import PROVENANCE_PATH, Provenance, ProvenanceFormatError
from xla_host.redact import scrub
from xla_host.wheel_filename import normalize, parse_wheel_name
from xla_wheels import sbom, venv_check
from xla_wheels.bundle import Bundle
from xla_wheels.publish import provenance_check as prov
from xla_wheels.publish.errors import IndexUnreachable, PublishError, VerifyFailed
from xla_wheels.publish.index import (
    IndexFile,
    check_reachable,
    credentials_for,
    pip_network_fault,
    reject_userinfo,
    remote_sha256,
    upload_url_for,
)
from xla_wheels.publish.requirements import write_requirements
from xla_wheels.publish.wheels import locked_records, locked_sboms, locked_versions
from xla_wheels.wheels_lock import BundleEntry, Lock, RuntimeWheelRecord, WheelRecord

IMPORT_TIMEOUT_S = 600.0
#: The size a public wheel is allowed for in pip's time limit (torch is ~900 MB, most
#: are far smaller).
RUNTIME_WHEEL_BYTES = 256 * 1024 * 1024
#: pip settings that would add other indexes or files to an install that must come from
#: INDEX_URL alone (``--no-deps`` mode); the TLS settings stay.
_PIP_SOURCE_VARS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX")


_IMPORT = (
    "import json, torch_xla; "
    "print(json.dumps({'version': getattr(torch_xla, '__version__', None), "
    "'file': torch_xla.__file__}))"
)


@dataclass
class Check:
    name: str
    status: str
    """``ok``, ``FAIL``, ``WARN`` or ``skipped``."""
    detail: str


@dataclass
class VerifyReport:
    bundle: str
    index_url: str
    requirements: str
    venv: str
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(check.status != "FAIL" for check in self.checks)

    def add(self, name: str, status: str, detail: str) -> None:
        self.checks.append(Check(name, status, detail))
        log.info(f"  {status:<7} {name}: {detail}")

    def render(self) -> str:
        lines = [
            f"verify-install {self.bundle}: {'PASSED' if self.passed else 'FAILED'}",
            f"  index         {self.index_url}",
            f"  requirements  {self.requirements}",
            f"  venv          {self.venv}",
        ]
        width = max((len(c.name) for c in self.checks), default=0)
        lines += [f"  {c.status:<7} {c.name:<{width}}  {c.detail}" for c in self.checks]
        return "\n".join(lines)


def _run(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float,
    check: bool = True,
    fix: str | None = None,
) -> subprocess.CompletedProcess[str]:
    return runner.run(
        argv,
        step=" ".join(argv[:4]),
        # Inline scripts are shown by name, not by their text.
        shown_argv=[arg if "\n" not in arg else "<script>" for arg in argv],
        base_env=env,
        timeout=timeout,
        timeout_fix="check that the index is reachable and answering",
        redact=scrub,  # URL credentials
        check=check,
        fix=fix,
    )


def create_venv(base_python: str, venv: Path, pip_cache: Path) -> Path:
    """A fresh venv of ``base_python`` whose ``python -m pip`` is the pip ``python -m venv``
    would install (ensurepip's bundled wheel), unpacked once per machine under
    ``pip_cache`` (:func:`xla_wheels.venv_check.pip_from_bundle`): ensurepip's install
    costs 5-10 s on a busy 2-core machine at every verify-install. Without a bundled
    wheel (a distribution's patched ensurepip), ensurepip installs it as before."""
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    fix = "install the venv module (Debian: python3-venv) or pass another PYTHON"
    _run([base_python, "-m", "venv", "--without-pip", str(venv)], timeout=300, fix=fix)
    python = venv / "bin" / "python"
    if (problem := venv_check.outside_venv(python, venv)) is not None:
        raise PublishError(problem, fix=venv_check.fix_for(venv))
    log.info(venv_check.pip_from_bundle(venv, pip_cache / venv_check.BUNDLED_PIP_DIR))
    return python


def borrow_packages(python: Path, deps_from: str) -> None:
    """Let ``python`` import what ``deps_from``'s environment has (torch), after its own.

    Called after the install on purpose: with the other environment on sys.path, pip would
    see its torch_xla as "already satisfied" and install nothing.
    """
    paths = _run(
        [deps_from, "-c", "import json, site; print(json.dumps(site.getsitepackages()))"],
        timeout=60,
        fix="pass DEPS_FROM=<python of an environment with torch installed>",
    )
    site = _run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"], timeout=60
    ).stdout.strip()
    # A .pth line is appended to sys.path after the venv's own site-packages: torch and
    # friends come from there, torch_xla still from the fresh install.
    (Path(site) / "xla_wheels_deps_from.pth").write_text("\n".join(json.loads(paths.stdout)) + "\n")


def _pip_env(index_url: str, *, isolated: bool) -> tuple[dict[str, str], list[str]]:
    """Environment for pip: the index URL (with credentials, if any) travels here."""
    # pip's child environment: it inherits ours (proxies, certificates).
    env = dict(os.environ)
    credentials = credentials_for(upload_url_for_or_same(index_url))
    url = index_url
    if credentials.username and credentials.password:
        parts = urllib.parse.urlsplit(index_url)
        userinfo = (
            f"{urllib.parse.quote(credentials.username, safe='')}:"
            f"{urllib.parse.quote(credentials.password, safe='')}"
        )
        url = urllib.parse.urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc}"))
    if isolated:
        for name in _PIP_SOURCE_VARS:
            env.pop(name, None)
        # No pip.conf either: an extra-index-url or find-links there could offer the file.
        env["PIP_CONFIG_FILE"] = os.devnull
        env["PIP_INDEX_URL"] = url
    else:
        env["PIP_EXTRA_INDEX_URL"] = url
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(venv_check.PIP_REQUIRE_VIRTUALENV)  # never into the interpreter behind the venv
    return env, credentials.secrets


def upload_url_for_or_same(index_url: str) -> str:
    """The keyring service name publish used (the upload URL) when derivable."""
    try:
        return upload_url_for(index_url)
    except Exception:
        return index_url


def _pip_install(
    argv: list[str],
    env: dict[str, str],
    secrets: list[str],
    index_url: str,
    ours: list[Any],
    runtime: list[RuntimeWheelRecord],
    network: NetworkPolicy,
) -> subprocess.CompletedProcess[str]:
    """pip install, with pip's own per-request timeout and retries set from the network
    settings (pip retries a refused or reset connection and HTTP 5xx itself), and a limit
    on the whole step by the size of what it downloads."""
    after = argv.index("install") + 1
    argv = [
        *argv[:after], "--no-input", "--timeout", f"{network.timeout_s:g}",
        "--retries", str(network.retries), *argv[after:],
    ]  # fmt: skip
    # A stall is pip's --timeout; this limit only ends a step that keeps trickling. The
    # lock records our wheels' sizes, not the public ones'.
    size = sum(record.size for record in ours) + RUNTIME_WHEEL_BYTES * len(runtime)
    limit = network.transfer_limit(size, child_process=True) + network.timeout_s * (
        network.retries + 1
    )
    remote = urllib.parse.urlsplit(index_url).scheme != "file"
    host = host_of(index_url) if remote else "the static index"
    step = "pip install --require-hashes"

    def install(seconds: float) -> subprocess.CompletedProcess[str]:
        try:
            return runner.run(
                argv,
                step=step,
                base_env=env,
                timeout=seconds,
                redact=lambda text: scrub(text, secrets),
                check=False,  # pip's output decides: a network fault is retried
            )
        except runner.StepTimedOut:
            raise Transient("timed out", f"pip did not finish within {seconds:g}s") from None

    def unreachable(fault: Transient, attempts: int) -> PublishError:
        return IndexUnreachable(f"{step}: {host} {fault.what_happened}", fix=_INDEX_FIX)

    return with_retries(
        step,
        host,
        install,
        give_up=unreachable,
        timeout_fix=f"check that the index at {host} is up and answering; a slow link: give "
        f"it longer with {TIMEOUT_SETTING}",
        limit_s=limit,
        long=True,
        # pip has retried each request already; a whole new install would only repeat it.
        network=replace(network, retries=0),
    )


_INDEX_FIX = "check that the index server is running and INDEX_URL is right"


def _probe_index(index_url: str, network: NetworkPolicy) -> None:
    """One read of the index's simple page with the credentials pip used: raises
    :class:`CredentialsRejected` (401/403), :class:`IndexUnreachable` (refused, 5xx) or
    :class:`NetworkTimedOut` (no answer), naming the host; returns when the index answers,
    so that pip's own report stands."""
    if urllib.parse.urlsplit(index_url).scheme == "file":
        return
    check_reachable(index_url, credentials_for(upload_url_for_or_same(index_url)), network=network)


# pip's report of a refused hash: the file's URL, the locked sha256 and what pip got.
_PIP_HASH_MISMATCH = re.compile(
    r"from (https?://[^\s#]+)\S* .*\n\s*Expected sha256 ([0-9a-f]{64})\s*\n\s*Got\s+([0-9a-f]{64})"
)


def _probe_refused_files(
    output: str, index_url: str, ours: list[WheelRecord], network: NetworkPolicy
) -> None:
    """A download cut short reaches pip as a file with another hash (pip does not check
    the length the server announced): download each refused file of our index once more,
    under our limits. A cut or a stall there is the network's error (raised by the read);
    the locked bytes on a second try mean the first transfer was damaged; other bytes
    leave pip's verdict, a real mismatch, to the report."""
    if urllib.parse.urlsplit(index_url).scheme == "file":
        return
    credentials = credentials_for(upload_url_for_or_same(index_url))
    sizes = {record.name: record.size for record in ours}
    for url, locked, got in _PIP_HASH_MISMATCH.findall(output):
        if host_of(url) != host_of(index_url):
            continue  # another index's file: our credentials are not for it
        name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        file = IndexFile(name, url, None)
        size = sizes.get(name, RUNTIME_WHEEL_BYTES)
        if remote_sha256(file, credentials, size=size, network=network) == locked:
            raise IndexUnreachable(
                f"pip install --require-hashes: {host_of(url)} sent {name} damaged (pip got "
                f"sha256 {got}); downloaded again, it is the locked file",
                fix="the file on the index is right; the transfer was cut or altered on the "
                "way (a proxy, a flaky link): run verify-install again",
            )


def verify_install(
    *,
    lock: Lock,
    bundle: Bundle,
    index_url: str,
    work: Path,
    pip_cache: Path,
    base_python: str,
    no_deps: bool,
    deps_from: str | None,
    require_provenance: bool,
    network: NetworkPolicy,
) -> VerifyReport:
    if urllib.parse.urlsplit(index_url).scheme != "file":
        reject_userinfo(index_url, "INDEX_URL")
    entry = lock.entry(bundle.name)
    ours = locked_records(lock, bundle.name)
    runtime = _runtime_records(bundle, entry, no_deps=no_deps)
    requirements = write_requirements(work / "requirements.txt", bundle, ours, runtime)
    venv = work / "venv"
    report = VerifyReport(bundle.name, scrub(index_url), str(requirements), str(venv))

    with log.section(f"verify-install: fresh venv {venv}"):
        python = create_venv(base_python, venv, pip_cache)
        pip = [str(python), "-m", "pip"]

    with log.section("verify-install: pip install --require-hashes"):
        installed = _install(
            report, pip, requirements, work=work, index_url=index_url, ours=ours,
            runtime=runtime, no_deps=no_deps, network=network,
        )  # fmt: skip
        if not installed:
            return report
        if deps_from:
            borrow_packages(python, deps_from)

    with log.section("verify-install: versions and provenance (before import)"):
        expected = locked_versions(ours)
        facts = probe(
            str(python),
            [*sorted(expected), "libtpu", "jax", "jaxlib"],
            fix=f"inspect the venv {venv} by hand",
        )
        _check_versions(report, facts, expected, runtime, venv)
        provenance = _check_provenance(report, facts, bundle, entry, require_provenance)
        # The SBOMs are compared with the provenance file (their one source) when it is sound.
        sound = report.checks[-1].name == "provenance" and report.checks[-1].status == "ok"
        for sbom_check in sbom.check_installed(
            facts.python,
            provenance if sound else None,
            locked=locked_sboms(ours),
            # --require-provenance: the bundle's own wheels must carry theirs.
            required=[parse_wheel_name(r.name).project for r in ours if require_provenance],
        ):
            report.add(f"sbom {sbom_check.project}", sbom_check.status, sbom_check.detail)

    with log.section("verify-install: import torch_xla"):
        if no_deps and not deps_from:
            report.add(
                "import",
                "skipped",
                "installed with --no-deps and no DEPS_FROM: torch is not in the venv",
            )
        else:
            _check_import(report, python, venv, expected)
    (work / "report.json").write_text(
        json.dumps({**asdict(report), "passed": report.passed}, indent=2) + "\n"
    )
    return report


def _runtime_records(
    bundle: Bundle, entry: BundleEntry, *, no_deps: bool
) -> list[RuntimeWheelRecord]:
    """The recorded runtime wheels to install beside ours (none with ``--no-deps``)."""
    if no_deps:
        return []
    if bundle.runtime and entry.runtime_wheels is None:
        raise PublishError(
            f"wheels.lock has no runtime wheels for {bundle.name}",
            fix=f"run `make requirements BUNDLE={bundle.name}` first (or pass NO_DEPS=1 "
            "to install only our wheels)",
        )
    return list(entry.runtime_wheels or ())


def _install(
    report: VerifyReport,
    pip: list[str],
    requirements: Path,
    *,
    work: Path,
    index_url: str,
    ours: list[WheelRecord],
    runtime: list[RuntimeWheelRecord],
    no_deps: bool,
    network: NetworkPolicy,
) -> bool:
    """``pip install --require-hashes`` into the venv; whether it installed (a refusal is
    a FAIL in ``report``, an index that did not answer an error of its own)."""
    env, secrets = _pip_env(index_url, isolated=no_deps)
    argv = [
        *pip, "install", "--require-hashes", "--no-cache-dir", "--only-binary=:all:",
        *(["--no-deps"] if no_deps else []), "-r", str(requirements),
    ]  # fmt: skip
    result = _pip_install(argv, env, secrets, index_url, ours, runtime, network)
    (work / "pip-install.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        # pip says "No matching distribution" whether the index refused our
        # credentials, was down or never answered: ask it once ourselves, so that the
        # error says which (and pip's hash errors stay for real hash mismatches).
        _probe_index(index_url, network)
        output = result.stdout + result.stderr
        if fault := pip_network_fault(
            output, index_url, step="pip install --require-hashes", network=network
        ):
            raise fault
        _probe_refused_files(output, index_url, ours, network)
        tail = "\n".join(
            line
            for line in (result.stdout + result.stderr).splitlines()
            if line.strip() and "is ignored" not in line
        )
        report.add("install", "FAIL", "pip refused or failed:\n" + tail[-3000:])
        return False
    report.add("install", "ok", f"{len(ours) + len(runtime)} pinned file(s) by sha256")
    return True


def _check_versions(
    report: VerifyReport,
    facts: HostFacts,
    expected: dict[str, str],
    runtime: list[RuntimeWheelRecord],
    venv: Path,
) -> None:
    """Our wheels installed at their locked versions inside the fresh venv, and the
    runtime's libtpu/jax/jaxlib at theirs."""
    for project, version in sorted(expected.items()):
        installed = facts.versions.get(project)
        location = facts.locations.get(project, "")
        inside = bool(location) and Path(location).resolve().is_relative_to(venv.resolve())
        status = "ok" if installed == version and inside else "FAIL"
        where = "" if inside else f" (NOT in the fresh venv: {location or 'missing'})"
        report.add(f"version {project}", status, f"installed {installed}, locked {version}{where}")
    for record in runtime:
        if record.project in ("libtpu", "jax", "jaxlib"):
            installed = facts.versions.get(record.project)
            status = "ok" if installed == record.version else "FAIL"
            report.add(
                f"version {record.project}",
                status,
                f"installed {installed}, locked {record.version}",
            )


def _check_provenance(
    report: VerifyReport,
    facts: HostFacts,
    bundle: Bundle,
    entry: BundleEntry,
    require_provenance: bool,
) -> Provenance | None:
    """The installed torch_xla's provenance file compared with the lock; the file read
    (None when absent or unreadable)."""
    try:
        provenance = facts.provenance()
    except ProvenanceFormatError as error:
        report.add(
            "provenance", "FAIL", f"{facts.provenance_path} does not follow the schema: {error}"
        )
        return None
    if provenance is None:
        status = "FAIL" if require_provenance else "WARN"
        report.add(
            "provenance",
            status,
            f"absent: {PROVENANCE_PATH} is not in the installed torch_xla, so this "
            "wheel cannot be tied to the bundle's commits and patches (a stock wheel, "
            "or one built before the build stage wrote provenance)",
        )
        return None
    check = prov.compare(provenance, bundle.name, entry)
    if check.problems:
        report.add("provenance", "FAIL", "; ".join(check.problems))
    else:
        compared = ", ".join(check.compared)
        report.add("provenance", "ok", f"matches wheels.lock: {compared}")
    return provenance


def _check_import(report: VerifyReport, python: Path, venv: Path, expected: dict[str, str]) -> None:
    """``import torch_xla`` in the venv: it must come from the venv, at its locked version."""
    # The import child inherits ours; PJRT_DEVICE is the host's runtime choice.
    env = {**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")}
    imported = _run([str(python), "-c", _IMPORT], env=env, timeout=IMPORT_TIMEOUT_S, check=False)
    if imported.returncode != 0:
        tail = "\n".join(imported.stderr.strip().splitlines()[-8:])
        report.add("import", "FAIL", f"import torch_xla failed:\n{tail}")
        return
    info = json.loads(imported.stdout.strip().splitlines()[-1])
    inside = Path(info["file"]).resolve().is_relative_to(venv.resolve())
    want = expected.get(normalize("torch_xla"))
    version_ok = want is None or info["version"] in (None, want)
    status = "ok" if inside and version_ok else "FAIL"
    where = "from the fresh venv" if inside else f"NOT from the venv: {info['file']}"
    report.add("import", status, f"torch_xla {info['version']} imported {where}")


def ensure_passed(report: VerifyReport) -> None:
    if not report.passed:
        failed = ", ".join(c.name for c in report.checks if c.status == "FAIL")
        raise VerifyFailed(
            f"verify-install of {report.bundle} failed: {failed}",
            fix="read the report above; a refused hash means the index serves a file that is "
            "not the locked one, and publish never overwrites a file on an index: have the "
            "index's admin delete that file, then `make publish BUNDLE=<bundle> "
            "INDEX_URL=<simple/ URL>` uploads the locked one from dist/ again",
        )
