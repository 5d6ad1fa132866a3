"""``record``: put wheels built elsewhere into a bundle's ``wheels.lock`` entry.

A stock control (torch_xla from PyPI under a bundle that pins it), or the output of a
builder fleet, becomes a bundle's wheels without running the build stage here. They are
held to what the build stage's own wheels are held to, and refused (nothing written)
when any check fails:

- the file name is a wheel's, of a project the bundle builds (torch, torch_xla), whose
  public version is the bundle's pin, whose ``+git<sha>`` label (if any) is the pinned
  commit, and whose tags are the bundle's CPython (``cp311`` for ``python = "3.11"``) on
  Linux;
- the wheel is whole: its ``.dist-info/METADATA`` names that project and version, and
  every file it holds hashes to its ``RECORD`` line; the sha256 of the file is the one a
  ``SHA256SUMS`` beside the wheels gives (``sha256sum`` format), when there is one;
- torch_xla's provenance, when the wheel carries one, matches the bundle's lock entry
  (commits, patch series, version: :mod:`xla_wheels.publish.provenance_check`); a wheel
  without provenance is taken only for a bundle without patches (it cannot show it
  carries them);
- no record is replaced silently: a wheel with the name, version and tags of one any
  bundle records but other bytes is refused (an index must never serve two files under
  one name, :mod:`xla_wheels.builder.rebuilt_wheels`), and so is a second wheel of a
  project this bundle already records. Recording the same file again changes nothing.

The lock entry's inputs are written first, as ``make lock`` does, then the wheels are
staged into ``dist/<bundle>`` and renamed into place together with the lock, as the
collect stage does (:func:`xla_wheels.builder.collect.commit_with_lock`): an interrupted
run leaves both as they were. The wheels the bundle already records stay, found in
``dist/<bundle>`` by their sha256.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from email.parser import HeaderParser
from pathlib import Path

from xla_host import log
from xla_host.errors import ExitCode, PipelineError
from xla_host.filemode import file_sha256, read_shared
from xla_host.provenance import PROVENANCE_PATH, Provenance, ProvenanceFormatError
from xla_host.wheel_filename import WheelFilenameError, WheelName, normalize, parse_wheel_name
from xla_wheels.builder import collect
from xla_wheels.builder.rebuilt_wheels import Recorded, replacements
from xla_wheels.bundle import Bundle
from xla_wheels.layout import BundleLayout
from xla_wheels.publish.provenance_check import compare
from xla_wheels.wheels_lock import (
    BundleEntry,
    WheelRecord,
    read_lock,
    update_bundle_entry,
    written_on_success,
)

SUMS_NAME = "SHA256SUMS"
"""The checksum file read beside the wheels when present (``sha256sum *.whl > SHA256SUMS``)."""

#: The projects a bundle builds, by normalized name -> its component.
BUILT = {normalize("torch"): "torch", normalize("torch_xla"): "torch_xla"}
_GIT_LABEL = re.compile(r"git([0-9a-f]{7,40})(?:\.|$)")
_SUMS_LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](.+)")


class WheelRefused(PipelineError):
    """A wheel offered to ``record`` fails a check; nothing was recorded."""

    exit_code = ExitCode.BAD_INPUT


@dataclass(frozen=True)
class Offered:
    path: Path
    name: WheelName
    sha256: str


def _refuse(bundle: Bundle, problems: Sequence[str], fix: str) -> WheelRefused:
    return WheelRefused(
        f"refusing to record wheels for bundle {bundle.name} (nothing was recorded):\n  "
        + "\n  ".join(problems),
        fix=fix,
    )


def read_sums(directory: Path) -> dict[str, str] | None:
    """File name -> sha256 of ``directory/SHA256SUMS``; None when there is none."""
    path = directory / SUMS_NAME
    if not path.exists():
        return None
    text = read_shared(path, what="checksum file").decode("utf-8", errors="replace")
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _SUMS_LINE.fullmatch(line.strip())
        if match is None:
            raise WheelRefused(
                f"{path}:{number} is not a `sha256sum` line: {line.strip()[:80]!r}",
                fix=f"write it with `sha256sum *.whl > {SUMS_NAME}` in {directory}",
            )
        sums[Path(match.group(2)).name] = match.group(1).lower()
    return sums


def _record_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def content_problems(wheel: Path, name: WheelName) -> list[str]:
    """What is wrong inside the wheel: METADATA naming another project or version, a
    file whose bytes differ from its RECORD line, a file RECORD does not list."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = {info.filename: info for info in archive.infolist() if not info.is_dir()}
            dist_info = f"{name.project}-{name.version}.dist-info"
            metadata_name = f"{dist_info}/METADATA"
            record_name = f"{dist_info}/RECORD"
            missing = [n for n in (metadata_name, record_name) if n not in members]
            if missing:
                return [f"{wheel.name}: has no {', '.join(missing)}"]
            headers = HeaderParser().parsestr(archive.read(metadata_name).decode("utf-8"))
            problems = []
            if normalize(headers.get("Name", "")) != name.normalized:
                problems.append(f"{wheel.name}: METADATA names project {headers.get('Name')!r}")
            if headers.get("Version") != name.version:
                problems.append(f"{wheel.name}: METADATA says version {headers.get('Version')!r}")
            listed: dict[str, str] = {}
            for line in archive.read(record_name).decode("utf-8").splitlines():
                path, _, rest = line.partition(",")
                listed[path] = rest.split(",")[0]
            for member in sorted(members):
                if member == record_name or member.endswith((".jws", ".p7s")):
                    continue
                digest = listed.get(member)
                if digest is None:
                    problems.append(f"{wheel.name}: {member} is not listed in RECORD")
                elif digest != f"sha256={_record_digest(archive.read(member))}":
                    problems.append(f"{wheel.name}: {member} does not match its RECORD hash")
            return problems
    except (zipfile.BadZipFile, UnicodeDecodeError, EOFError) as error:
        return [f"{wheel.name}: not a readable wheel ({error})"]


def name_problems(bundle: Bundle, name: WheelName, commits: Mapping[str, str]) -> list[str]:
    """What in the file name disagrees with the bundle's pins."""
    component = BUILT.get(name.normalized)
    if component is None:
        return [
            f"{name.filename}: {name.project} is not a project a bundle builds (torch, "
            "torch_xla)"
        ]
    problems = []
    pin = bundle.component(component)
    public, _, local = name.version.partition("+")
    if public != pin.version:
        problems.append(
            f"{name.filename}: version {public}, the bundle pins {component} {pin.version}"
        )
    label = _GIT_LABEL.match(local)
    commit = commits.get(component) or pin.commit or ""
    if label is not None and not (commit.startswith(label[1]) or label[1].startswith(commit)):
        problems.append(
            f"{name.filename}: built from commit {label[1]}, the bundle pins {commit or 'none'}"
        )
    wanted = f"cp{bundle.python.replace('.', '')}"
    if wanted not in name.python.split(".") or wanted not in name.abi.split("."):
        problems.append(
            f"{name.filename}: tags {name.python}-{name.abi}, the bundle's Python "
            f"{bundle.python} needs {wanted}-{wanted}"
        )
    if not any(p.startswith(("linux_", "manylinux")) for p in name.platform.split(".")):
        problems.append(f"{name.filename}: platform {name.platform} is not Linux")
    return problems


def _provenance(wheel: Path) -> Provenance | None | str:
    """The wheel's provenance; None without one; a problem's text when it is unreadable."""
    with zipfile.ZipFile(wheel) as archive:
        if PROVENANCE_PATH not in archive.namelist():
            return None
        try:
            return Provenance.from_bytes(archive.read(PROVENANCE_PATH))
        except ProvenanceFormatError as error:
            return f"{wheel.name}: {PROVENANCE_PATH} is not a provenance file: {error}"


def offered_wheels(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise WheelRefused(
            f"{directory} is not a directory of wheels",
            fix="pass the directory holding the .whl files: WHEELS=<dir> (--wheels)",
        )
    wheels = sorted(p for p in directory.glob("*.whl") if p.is_file())
    if not wheels:
        raise WheelRefused(
            f"{directory} holds no .whl file",
            fix="pass the directory the wheels were downloaded or built into",
        )
    return wheels


def record_external(
    layout: BundleLayout,
    bundle: Bundle,
    directory: Path,
    resolved: Mapping[str, str | None],
    root: Path,
) -> list[Path]:
    """Check every wheel in ``directory`` and record them in the bundle's lock entry and
    ``dist/<bundle>``, all or none. Returns the recorded files in ``dist/<bundle>``.

    The checks run in order, each refusing with its own fix before the next: the names
    and sums, the contents (RECORD), one wheel per project, what the lock already records,
    the provenance, and the files the lock keeps."""
    with written_on_success():
        entry = update_bundle_entry(layout.lock_path, bundle, resolved, root)
        offered = _offered(bundle, directory, entry)
        kept = _kept_records(layout, bundle, entry, offered)
        with_new = replace(
            entry, wheels=tuple(kept) + tuple(collect.records([w.path for w in offered]))
        )
        problems = _provenance_problems(bundle, offered, with_new)
        if problems:
            raise _refuse(
                bundle,
                problems,
                "record the wheels built from this bundle's pins "
                "(`make wheels BUNDLE=...` stamps that provenance)",
            )
        keep_paths = _kept_paths(layout, bundle, kept)
        with collect.staging(layout, [*keep_paths, *(w.path for w in offered)]) as staged:
            target = collect.commit_with_lock(layout, staged)
    return sorted(target / w.path.name for w in offered)


def _offered(bundle: Bundle, directory: Path, entry: BundleEntry) -> list[Offered]:
    """The wheels in ``directory``, refused unless their names, sums and contents are
    the bundle's pins as built, one per project."""
    commits = {name: pin.commit for name, pin in entry.components.items()}
    sums = read_sums(directory)
    offered: list[Offered] = []
    problems: list[str] = []
    for path in offered_wheels(directory):
        try:
            name = parse_wheel_name(path.name)
        except WheelFilenameError as error:
            problems.append(error.message)
            continue
        sha = file_sha256(path)
        offered.append(Offered(path, name, sha))
        problems += name_problems(bundle, name, commits)
        if sums is not None and sums.get(path.name) != sha:
            given = sums.get(path.name)
            problems.append(
                f"{path.name}: sha256 {sha}, {SUMS_NAME} "
                + (f"says {given}" if given else "does not list it")
            )
    if problems:
        raise _refuse(
            bundle,
            problems,
            "record the wheels this bundle pins, as built "
            "(do not rename wheel files), or pin what they are in "
            f"build/bundles/{bundle.name}.toml and `make lock BUNDLE={bundle.name}`",
        )
    for wheel in offered:
        problems += content_problems(wheel.path, wheel.name)
    if problems:
        raise _refuse(
            bundle, problems, "fetch or build the wheel again: it changed after " "it was built"
        )
    projects = [w.name.normalized for w in offered]
    twice = sorted({p for p in projects if projects.count(p) > 1})
    if twice:
        raise _refuse(
            bundle,
            [f"more than one wheel of {p}" for p in twice],
            "keep one wheel per project in the directory",
        )
    return offered


def _kept_records(
    layout: BundleLayout, bundle: Bundle, entry: BundleEntry, offered: list[Offered]
) -> list[WheelRecord]:
    """The bundle's records no offered wheel replaces; refused when an offered wheel would
    replace a different record, here or under another bundle's name."""
    recorded = [
        Recorded(name, wheel.name, wheel.sha256)
        for name, other in sorted(read_lock(layout.lock_path).bundles.items())
        for wheel in other.wheels or ()
    ]
    same_name = replacements([w.path for w in offered], recorded)
    problems = [
        f"{r.wheel.name}: sha256 {r.sha256}, but wheels.lock ({c.bundle}) records "
        f"{c.name} with sha256 {c.sha256}"
        for r in same_name
        for c in r.recorded
    ]
    kept = []
    for record in entry.wheels or ():
        project = parse_wheel_name(record.name).normalized
        new = next((w for w in offered if w.name.normalized == project), None)
        if new is None:
            kept.append(record)
        elif (new.path.name, new.sha256) != (record.name, record.sha256) and not any(
            r.wheel == new.path
            for r in same_name  # already named above
        ):
            problems.append(
                f"{new.path.name}: the bundle already records {record.name} "
                f"(sha256 {record.sha256}) for {project}"
            )
    if problems:
        raise _refuse(
            bundle,
            problems,
            "a recorded wheel is never replaced silently: if the recorded one is wrong, "
            f'remove its [[bundles."{bundle.name}".wheels]] row from wheels.lock in a '
            "reviewed change and run again; otherwise record these under a bundle of "
            "their own (one that extends this one)",
        )
    return kept


def _provenance_problems(
    bundle: Bundle, offered: list[Offered], with_new: BundleEntry
) -> list[str]:
    """torch_xla's provenance against the entry it would be recorded in (a stock wheel,
    with none, only for a bundle without patches)."""
    patched = any(component.patches for component in bundle.components.values())
    problems: list[str] = []
    for wheel in offered:
        if wheel.name.normalized != normalize("torch_xla"):
            continue
        found = _provenance(wheel.path)
        if isinstance(found, str):
            problems.append(found)
        elif found is None and patched:
            problems.append(
                f"{wheel.path.name}: carries no {PROVENANCE_PATH}, so it cannot show it "
                f"carries the patches of bundle {bundle.name}"
            )
        elif found is None:
            log.info(
                f"{wheel.path.name}: no provenance (a stock wheel): judged by its "
                "name, version, tags and RECORD"
            )
        else:
            check = compare(found, bundle.name, with_new)
            problems += [f"{wheel.path.name}: {p}" for p in check.problems]
            log.info(f"{wheel.path.name}: provenance compared: {', '.join(check.compared)}")
    return problems


def _kept_paths(layout: BundleLayout, bundle: Bundle, kept: list[WheelRecord]) -> list[Path]:
    """The files of the records kept, which ``dist/<bundle>`` must hold as recorded."""
    problems = []
    paths = []
    for record in kept:
        path = layout.dist / record.name
        if not path.is_file() or file_sha256(path) != record.sha256:
            problems.append(
                f"wheels.lock records {record.name} but {layout.dist} does not hold it "
                "with that sha256"
            )
        paths.append(path)
    if problems:
        raise _refuse(
            bundle,
            problems,
            f"restore the recorded files into {layout.dist} " "(from your index), then run again",
        )
    return paths
