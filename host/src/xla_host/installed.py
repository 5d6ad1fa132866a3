"""Which locked wheel files an installed environment runs: matched by content.

pip keeps no record of the sha256 of the wheel file it installed from (``direct_url.json``
exists only for direct URL installs, and an index install records nothing), so the wheel
hash cannot be read back from an environment. What *can* be checked honestly is content:
every file inside a locked wheel (the lock's sha256 is verified on the wheel file first)
must be installed, byte for byte, at the place the installer puts it. We hash both sides
ourselves and never trust a RECORD file's hash column alone:

* wheel side: every member of the zip, hashed from its bytes; ``*.dist-info/RECORD`` (and
  its signatures) and ``__pycache__/*.pyc`` are left out (the installer rewrites or
  generates them), ``<name>.data/purelib|platlib/x`` is compared at ``x``, and other
  ``.data`` trees (scripts get a new shebang) are not compared;
* installed side: the same paths under the distribution's site directory, hashed from
  disk; besides, every file the installed RECORD lists under the site directory must be
  either a wheel member or one the installer writes (INSTALLER, REQUESTED,
  direct_url.json, RECORD, bytecode).

A match therefore means "this environment runs exactly the files of the wheel with this
sha256". Two wheel files with identical members but different zip metadata would both
match; for judging a runtime that is the same build. Files added into a package directory
without a RECORD entry are not seen. The wheel files must be at hand (``dist/<bundle>/``,
or ``pip download --no-deps --require-hashes`` from the lane's index on a TPU VM).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from xla_host import filemode
from xla_host.filemode import file_sha256
from xla_host.installed_metadata import ProbeFailed, read_installed
from xla_host.wheel_filename import normalize, parse_wheel_name


class WheelRecord(Protocol):
    """A locked wheel as the match needs it: the lock's row, or the bundle document's."""

    @property
    def name(self) -> str: ...

    @property
    def sha256(self) -> str: ...


#: Projects whose versions every receipt records (the ones that decide restart behaviour).
VERSION_PROJECTS = ("torch", "torch_xla", "libtpu", "libtpu-nightly", "jax", "jaxlib")
PROBE_TIMEOUT_S = 300.0
_INSTALLER_FILES = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


@dataclass(frozen=True)
class InstalledFacts:
    """What the probe read from the environment under test (metadata only)."""

    versions: Mapping[str, str | None]
    dists: Mapping[str, Mapping[str, Any]]
    """normalized project -> {version, site, record (paths relative to site)}."""


@dataclass(frozen=True)
class WheelMatch:
    """One locked wheel file against the environment."""

    name: str
    sha256: str
    project: str
    version: str
    matched: bool
    files: int
    """Wheel members compared byte for byte."""
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnvironmentMatch:
    wheels: tuple[WheelMatch, ...]
    problems: tuple[str, ...]
    """Why the environment is not the lock's wheels (empty when it is)."""

    @property
    def matches_lock(self) -> bool:
        return bool(self.wheels) and not self.problems and all(w.matched for w in self.wheels)


def probe_environment(python: Path, projects: Sequence[str]) -> InstalledFacts:
    """Versions of :data:`VERSION_PROJECTS` and the RECORD of ``projects``, from ``python``."""
    try:
        found = read_installed(
            str(python), VERSION_PROJECTS, with_files=projects, timeout=PROBE_TIMEOUT_S
        )
    except ProbeFailed as error:
        return InstalledFacts({}, {"_error": {"error": error.message}})
    dists = {
        normalize(name): {"version": dist.version, "site": dist.site, "record": list(dist.files)}
        for name, dist in found.dists.items()
        if name in projects
    }
    return InstalledFacts({name: found.version_of(name) for name in VERSION_PROJECTS}, dists)


def _b64_sha256(handle: IO[bytes]) -> str:
    """The sha256 of what ``handle`` reads, in RECORD's spelling (urlsafe base64)."""
    hasher = hashlib.sha256()
    for block in iter(lambda: handle.read(1 << 20), b""):
        hasher.update(block)
    return base64.urlsafe_b64encode(hasher.digest()).rstrip(b"=").decode()


def _installed_path(member: str) -> str | None:
    """Where an installer puts a wheel member, relative to site-packages; None: skipped."""
    parts = member.split("/")
    if parts[0].endswith(".dist-info") and parts[-1] in ("RECORD", "RECORD.jws", "RECORD.p7s"):
        return None
    if "__pycache__" in parts and member.endswith(".pyc"):
        return None
    if parts[0].endswith(".data"):
        if len(parts) > 2 and parts[1] in ("purelib", "platlib"):
            return "/".join(parts[2:])
        return None
    return member


def wheel_content(path: Path, cache_dir: Path | None = None) -> dict[str, str]:
    """Installed path -> urlsafe-base64 sha256 (RECORD's spelling) of every compared member.

    Cached per wheel sha256 under ``cache_dir`` (a torch_xla wheel holds a 400 MB library).
    """
    cache_file = None
    if cache_dir is not None:
        cache_file = cache_dir / f"{file_sha256(path)}.json"
        if cache_file.is_file():
            raw = filemode.read_shared(cache_file, what="cache entry")  # a FIFO: refused
            cached: dict[str, str] = json.loads(raw)
            return cached
    content: dict[str, str] = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            target = _installed_path(info.filename)
            if target is None:
                continue
            with archive.open(info) as handle:
                content[target] = _b64_sha256(handle)
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        filemode.write_by_rename(cache_file, json.dumps(content, sort_keys=True))
    return content


def _disk_b64(path: Path) -> str | None:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # a FIFO or device where a file was installed: no match, no wait
        with path.open("rb") as handle:
            return _b64_sha256(handle)
    except OSError:
        return None


def match_wheel(
    record: WheelRecord, wheel_path: Path | None, facts: InstalledFacts, cache_dir: Path | None
) -> WheelMatch:
    name = parse_wheel_name(record.name)
    project = name.normalized

    def result(matched: bool, files: int, *problems: str) -> WheelMatch:
        return WheelMatch(
            record.name, record.sha256, project, name.version, matched, files, tuple(problems)
        )

    if wheel_path is None or not wheel_path.is_file():
        return result(False, 0, f"{record.name}: the locked wheel file is not at hand to compare")
    actual = file_sha256(wheel_path)
    if actual != record.sha256:
        return result(False, 0, f"{wheel_path}: sha256 {actual}, wheels.lock has {record.sha256}")
    dist = facts.dists.get(project)
    if dist is None:
        return result(False, 0, f"{project} is not installed in the environment under test")
    if str(dist["version"]) != name.version:
        return result(
            False, 0, f"installed {project} is {dist['version']}, the locked wheel {name.version}"
        )
    site = Path(str(dist["site"]))
    content = wheel_content(wheel_path, cache_dir)
    problems: list[str] = []
    for member, digest in sorted(content.items()):
        on_disk = _disk_b64(site / member)
        if on_disk is None:
            problems.append(f"{project}: {member} of the wheel is not installed")
        elif on_disk != digest:
            problems.append(f"{project}: installed {member} differs from the wheel's")
    for listed in dist["record"]:
        listed = str(listed)
        if listed.startswith("..") or listed in content:
            continue
        base = listed.rsplit("/", 1)[-1]
        if listed.endswith(".pyc") or (".dist-info/" in listed and base in _INSTALLER_FILES):
            continue
        problems.append(f"{project}: installed RECORD lists {listed}, which the wheel lacks")
    shown = problems[:5] + ([f"... and {len(problems) - 5} more"] if len(problems) > 5 else [])
    return result(not problems, len(content), *shown)


def match_environment(
    python: Path,
    locked: Sequence[WheelRecord],
    wheel_dir: Path | None,
    cache_dir: Path | None = None,
) -> tuple[InstalledFacts, EnvironmentMatch]:
    """Probe ``python`` and compare it with every locked wheel (files from ``wheel_dir``)."""
    projects = [parse_wheel_name(r.name).project for r in locked]
    facts = probe_environment(python, projects)
    problems: list[str] = []
    if "_error" in facts.dists:
        problems.append(f"could not read the environment: {facts.dists['_error']['error']}")
    if not locked:
        problems.append("no locked wheels to compare with")
    matches = tuple(
        match_wheel(r, (wheel_dir / r.name) if wheel_dir else None, facts, cache_dir)
        for r in locked
    )
    for match in matches:
        problems.extend(match.problems)
    return facts, EnvironmentMatch(matches, tuple(problems))
