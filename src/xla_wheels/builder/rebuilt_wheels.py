"""A rebuilt wheel against the wheels ``wheels.lock`` records: never replaced silently.

The packing is reproducible (``wheel_stamp.repack_wheel``), but a compiler may still make
different bytes from the same inputs (after the stage cache was wiped, on another
builder). Such a wheel has the file name of one already recorded, maybe already
published and installed, with another sha256: a host that pinned the recorded hash would
refuse it, and an index must never serve two files under one name. So collect stops and
offers the two ways that work:

- keep the recorded wheel (``KEEP_RECORDED=1``): the recorded file, found by its sha256
  in ``dist/`` or the stage cache, is put back into the stage the bundle uses;
- give the new build its own file name with a PEP 427 build tag (``BUILD_TAG=<n>``):
  ``torch_xla-2.9.0+gitc04e61c.p1a2b3c4d-1-cp311-cp311-linux_x86_64.whl``. pip installs
  the highest build tag of a version, ``==version`` pins still match, and the hash pins
  of ``make requirements`` name the file exactly.

A wheel "replaces" a recorded one when the name, version and tags (all but the build
tag) are the same, the bytes differ from every recorded file of that name, and its
build tag is not higher than every recorded one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xla_host import filemode, log
from xla_host.errors import PipelineError
from xla_host.filemode import file_sha256
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels import wheel_stamp
from xla_wheels.builder.spec import record_stage
from xla_wheels.wheels_lock import read_lock


class RecordedWheelDiffers(PipelineError):
    """A rebuilt wheel would replace a recorded (maybe published) one under its name."""


@dataclass(frozen=True)
class Recorded:
    bundle: str
    name: str
    sha256: str


@dataclass(frozen=True)
class Replacement:
    wheel: Path
    sha256: str
    recorded: tuple[Recorded, ...]
    """The recorded wheels of the same name, version and tags (any build tag)."""


def _identity(filename: str) -> tuple[str, ...]:
    name = parse_wheel_name(filename)
    return (name.project, name.version, name.python, name.abi, name.platform)


def build_number(filename: str) -> int:
    """The build tag as a number; -1 without one (lower than any tag)."""
    tag = parse_wheel_name(filename).build
    digits = "".join(c for c in tag or "" if c.isdigit())
    return int(digits) if tag and digits else -1


def replacements(wheels: Sequence[Path], recorded: Sequence[Recorded]) -> list[Replacement]:
    found = []
    for wheel in wheels:
        same = tuple(r for r in recorded if _identity(r.name) == _identity(wheel.name))
        if not same:
            continue
        sha = file_sha256(wheel)
        if any(r.name == wheel.name and r.sha256 == sha for r in same):
            continue
        if build_number(wheel.name) > max(build_number(r.name) for r in same):
            continue
        found.append(Replacement(wheel, sha, same))
    return found


def find_recorded_file(record: Recorded, dist_root: Path, cache_dir: Path) -> Path | None:
    """The recorded file by its sha256: in ``<dist>/<any bundle>/`` or the stage cache."""
    candidates = [
        *sorted(dist_root.glob(f"*/{record.name}")),
        *sorted((cache_dir / "stages").glob(f"*/{record.name}")),
    ]
    return next((p for p in candidates if p.is_file() and file_sha256(p) == record.sha256), None)


def put_in_stage(stage: Path, source: Path, old: Path) -> Path:
    """Make ``source`` the stage's wheel (copy + rename, then its stage.json), drop ``old``."""
    target = stage / source.name
    if source.resolve() != target.resolve():
        filemode.copy_by_rename(source, target)
    record_stage(target)
    if old.name != target.name:
        old.unlink(missing_ok=True)
    return target


def _describe(replacement: Replacement) -> str:
    lines = [f"{replacement.wheel.name}: rebuilt with sha256 {replacement.sha256}"]
    lines += [
        f"  wheels.lock ({r.bundle}) records {r.name} with sha256 {r.sha256}"
        for r in replacement.recorded
    ]
    return "\n  ".join(lines)


def settle(
    wheels: Sequence[Path],
    *,
    bundle: str,
    lock_path: Path,
    dist_root: Path,
    cache_dir: Path,
    keep_recorded: bool,
    build_tag: str | None,
) -> None:
    """Stop, keep the recorded wheel or tag the new one, for each wheel in its stage.

    Raises :class:`RecordedWheelDiffers` naming both sha256s when nothing was chosen (or
    what was chosen cannot work); otherwise leaves each stage holding the wheel to ship.
    """
    recorded = [
        Recorded(bundle, wheel.name, wheel.sha256)
        for bundle, entry in sorted(read_lock(lock_path).bundles.items())
        for wheel in entry.wheels or ()
    ]
    found = replacements(wheels, recorded)
    if not found:
        return
    described = "\n  ".join(_describe(r) for r in found)
    highest = max(build_number(r.name) for f in found for r in f.recorded)
    if keep_recorded:
        missing = []
        for replacement in found:
            newest = max(replacement.recorded, key=lambda r: (build_number(r.name), r.bundle))
            source = find_recorded_file(newest, dist_root, cache_dir)
            if source is None:
                missing.append(f"{newest.name} sha256 {newest.sha256}")
                continue
            put_in_stage(replacement.wheel.parent, source, replacement.wheel)
            log.info(f"kept the recorded {newest.name} (sha256 {newest.sha256}) from {source}")
        if missing:
            raise RecordedWheelDiffers(
                "KEEP_RECORDED: the recorded file is neither in dist/ nor in the stage "
                "cache:\n  " + "\n  ".join(missing),
                fix=f"download it from your index into dist/{bundle}/ and run again, or "
                f"`make wheels BUNDLE={bundle} BUILD_TAG={max(highest, 0) + 1}`",
            )
        return
    if build_tag is not None:
        if int(build_tag) <= highest:
            raise RecordedWheelDiffers(
                f"BUILD_TAG={build_tag} is not higher than the build tag already recorded:\n  "
                + described,
                fix=f"`make wheels BUNDLE={bundle} BUILD_TAG={highest + 1}`",
            )
        for replacement in found:
            tagged = wheel_stamp.with_build_tag(replacement.wheel, build_tag)
            put_in_stage(replacement.wheel.parent, tagged, replacement.wheel)
            log.info(f"new build {tagged.name}, sha256 {file_sha256(tagged)}")
        return
    raise RecordedWheelDiffers(
        "a rebuilt wheel has the file name of a recorded one but different bytes; it would "
        "replace a wheel that may already be published and installed (nothing was changed):"
        "\n  " + described,
        fix=f"keep the recorded wheel: `make wheels BUNDLE={bundle} KEEP_RECORDED=1` "
        f"(--keep-recorded), or give the new build its own file name with a build number: "
        f"`make wheels BUNDLE={bundle} BUILD_TAG={max(highest, 0) + 1}` (--build-tag)",
    )
