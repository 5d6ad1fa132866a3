"""``requirements``: the hash-pinned requirements file a training host installs from.

Our wheels' hashes come from ``wheels.lock`` (``wheels``). The public runtime wheels
(libtpu, jax, jaxlib) and everything our wheels and they pull are resolved by pip itself
(``pip install --dry-run --report``, for the bundle's Python and the hosts' platform, from
the index pip is configured with) and recorded in ``wheels.lock`` as
``[[bundles."<name>".runtime-wheels]]`` with ``[bundles."<name>".runtime-wheels-for]``
saying what they were resolved for. Later runs reuse the record while those inputs are
unchanged, so the file is reproducible and needs no network.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_host import filemode, log, runner
from xla_host.net import TIMEOUT_SETTING, NetworkPolicy
from xla_host.wheel_filename import normalize, parse_wheel_name
from xla_wheels.bundle import Bundle
from xla_wheels.publish.errors import PublishError
from xla_wheels.publish.index import pip_network_fault
from xla_wheels.publish.wheels import LocalWheel
from xla_wheels.wheels_lock import (
    Lock,
    RuntimeResolution,
    RuntimeWheelRecord,
    WheelRecord,
    record_runtime_wheels,
)

#: What the resolver is allowed to download in its deadline: metadata, or whole wheels
#: where an index serves no separate metadata (``NET_TIMEOUT=60``: about 22 minutes).
RESOLVE_BYTES_ALLOWANCE = 256 * 1024 * 1024
REQUIREMENTS_NAME = "requirements.txt"
#: A lane's second install list: the host package alone, by hash (``pip install --no-deps``
#: on a host that keeps its own torch environment; docs/on-a-tpu-host.md "Runbook").
HOST_REQUIREMENTS_NAME = "host-requirements.txt"


def host_platforms(glibc_minor: int = 35, arch: str = "x86_64") -> list[str]:
    """Platform tags a TPU VM (Ubuntu 22.04, glibc 2.35, x86_64) accepts.

    pip does not widen an explicit ``--platform manylinux_2_35`` to older manylinux tags,
    so every accepted tag is listed; ``linux_x86_64`` is what an unrepaired local build
    (ours) carries.
    """
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc_minor, 16, -1)]
    return [*tags, f"manylinux2014_{arch}", f"linux_{arch}"]


@dataclass(frozen=True)
class Requirement:
    project: str
    version: str
    hashes: tuple[str, ...]
    ours: bool

    def render(self) -> str:
        lines = [f"{self.project}=={self.version}"]
        lines.extend(f"--hash=sha256:{digest}" for digest in self.hashes)
        return " \\\n    ".join(lines)


def runtime_specifiers(bundle: Bundle) -> list[str]:
    """``libtpu==0.0.36`` etc.: the one version of each runtime pin that hosts install."""
    return [f"{pin.name}=={pin.install_version}" for pin in bundle.runtime.values()]


def resolution_inputs(
    bundle: Bundle, wheels: Sequence[WheelRecord], platforms: Sequence[str]
) -> RuntimeResolution:
    """What a runtime resolution depends on; its digest marks the lock record stale."""
    inputs = {
        "python": bundle.python,
        "platforms": list(platforms),
        "runtime": runtime_specifiers(bundle),
        "wheels": sorted(f"{w.name}:{w.sha256}" for w in wheels),
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return RuntimeResolution(bundle.python, tuple(platforms), digest)


def _pip_report(argv: list[str], network: NetworkPolicy) -> dict[str, Any]:
    """pip's resolution report, pip bounded as every network step: its own ``--timeout``
    and ``--retries`` from the network settings, and a deadline on the whole command."""
    step = "pip resolving the runtime wheels"
    with tempfile.TemporaryDirectory(prefix="xla-wheels-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        # The debug log: the only place pip names a page it could not read.
        pip_log = Path(tmp) / "pip.log"
        full = [
            *argv[:4], "--report", str(report), "--log", str(pip_log), "--no-input",
            "--timeout", f"{network.timeout_s:g}", "--retries", str(network.retries), *argv[4:],
        ]  # fmt: skip
        # A stall is pip's --timeout; this ends a resolution that keeps trickling.
        limit = network.transfer_limit(RESOLVE_BYTES_ALLOWANCE, child_process=True)
        limit += network.timeout_s * network.attempts
        result = runner.run(
            full,
            step=step,
            timeout=limit,
            timeout_fix="check that the package index pip is configured with is reachable; a "
            f"slow link: give it longer with {TIMEOUT_SETTING}",
            check=False,
        )
        if result.returncode != 0:
            output = result.stdout + result.stderr
            if pip_log.is_file():
                output += pip_log.read_text(errors="replace")
            # pip's configured index is pip's setting: the host comes from what pip says.
            if fault := pip_network_fault(output, None, step=step, network=network):
                raise fault
            tail = "\n".join(
                line for line in result.stderr.splitlines()[-15:] if "is ignored" not in line
            )
            raise PublishError(
                f"pip could not resolve the bundle's runtime closure:\n{tail}",
                fix="check the runtime pins in the bundle (do those versions ship wheels for "
                "its Python?) and that the package index is reachable",
            )
        return json.loads(report.read_text())


def resolve_runtime(
    bundle: Bundle,
    wheels: Sequence[LocalWheel],
    platforms: Sequence[str],
    *,
    network: NetworkPolicy,
) -> list[RuntimeWheelRecord]:
    """pip's resolution of our wheels + the runtime pins; our own wheels left out."""
    argv = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
        "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
        "--python-version", bundle.python, "--implementation", "cp",
    ]  # fmt: skip
    for tag in platforms:
        argv += ["--platform", tag]
    argv += [str(w.path) for w in wheels]
    argv += runtime_specifiers(bundle)
    report = _pip_report(argv, network)
    ours = {w.name.normalized for w in wheels}
    records: list[RuntimeWheelRecord] = []
    for item in report.get("install", []):
        project = normalize(item["metadata"]["name"])
        if project in ours:
            continue
        info = item.get("download_info", {})
        url = info.get("url", "")
        archive = info.get("archive_info", {})
        digest = archive.get("hashes", {}).get("sha256")
        if not digest and str(archive.get("hash", "")).startswith("sha256="):
            digest = archive["hash"].split("=", 1)[1]
        if not digest:
            raise PublishError(
                f"the package index gives no sha256 for {project} ({url})",
                fix="use an index that publishes hashes (PEP 503 #sha256= links)",
            )
        filename = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        records.append(
            RuntimeWheelRecord(
                project=project,
                version=str(item["metadata"]["version"]),
                name=filename,
                sha256=digest,
            )
        )
    return records


def runtime_records(
    lock_path: Path,
    lock: Lock,
    bundle: Bundle,
    wheels: Sequence[LocalWheel],
    platforms: Sequence[str],
    *,
    network: NetworkPolicy,
    refresh: bool = False,
) -> list[RuntimeWheelRecord]:
    """The runtime wheels ``lock`` (the caller's parse of ``lock_path``) records if still
    valid, else a fresh resolution, recorded in ``lock_path``."""
    wanted = resolution_inputs(bundle, [w.record for w in wheels], platforms)
    entry = lock.entry(bundle.name)
    recorded_for = entry.runtime_wheels_for
    if (
        not refresh
        and recorded_for is not None
        and recorded_for.inputs_sha256 == wanted.inputs_sha256
    ):
        log.info("runtime wheels: reusing the resolution recorded in wheels.lock")
        return list(entry.runtime_wheels or ())
    with log.section(f"requirements: resolve the runtime closure for Python {bundle.python}"):
        records = resolve_runtime(bundle, wheels, platforms, network=network)
        for record in records:
            log.info(f"  {record.name} sha256:{record.sha256}")
    record_runtime_wheels(lock_path, bundle.name, records, wanted)
    log.info(f"wheels.lock: recorded {len(records)} runtime wheel(s) for {bundle.name}")
    return records


def requirement_lines(
    ours: Sequence[WheelRecord], runtime: Sequence[RuntimeWheelRecord]
) -> list[Requirement]:
    grouped: dict[tuple[str, str, bool], list[str]] = {}
    for record in ours:
        name = parse_wheel_name(record.name)
        grouped.setdefault((name.normalized, name.version, True), []).append(record.sha256)
    for runtime_record in runtime:
        grouped.setdefault((runtime_record.project, runtime_record.version, False), []).append(
            runtime_record.sha256
        )
    return [
        Requirement(project, version, tuple(sorted(set(hashes))), ours)
        for (project, version, ours), hashes in sorted(grouped.items())
    ]


def render_requirements(bundle_name: str, python: str, requirements: Sequence[Requirement]) -> str:
    ours = [r for r in requirements if r.ours]
    public = [r for r in requirements if not r.ours]
    parts = [
        f"# Hash-pinned requirements of bundle {bundle_name} (Python {python}), generated by\n"
        f"# `make requirements BUNDLE={bundle_name}` from wheels.lock: do not edit. Install:\n"
        "#   pip install --require-hashes --extra-index-url <INDEX_URL> -r requirements.txt\n"
        "# (public wheels from pip's configured index, ours from INDEX_URL; every file is\n"
        "# pinned by sha256, so no index can substitute another file)\n",
        "# Our wheels (wheels.lock: wheels)",
        *(r.render() for r in ours),
    ]
    if public:
        parts += ["", "# Public runtime wheels and dependencies (wheels.lock: runtime-wheels)"]
        parts += [r.render() for r in public]
    return "\n".join(parts) + "\n"


def requirements_text(
    bundle: Bundle, ours: Sequence[WheelRecord], runtime: Sequence[RuntimeWheelRecord]
) -> str:
    return render_requirements(bundle.name, bundle.python, requirement_lines(ours, runtime))


def write_requirements(
    path: Path,
    bundle: Bundle,
    ours: Sequence[WheelRecord],
    runtime: Sequence[RuntimeWheelRecord],
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    filemode.write_by_rename(path, requirements_text(bundle, ours, runtime))
    return path
