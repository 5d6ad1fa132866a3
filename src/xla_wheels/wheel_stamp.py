"""Version stamp and provenance: a patched wheel can never pass for a stock one.

The local version label carries the source commit and a digest of everything patched into
the wheel: ``2.9.0+gitc04e61c.p1a2b3c4d``. PEP 440 local labels allow ``[a-z0-9.]``, and
pip orders ``2.9.0+...`` after ``2.9.0``, so a host that pins ``torch_xla==2.9.0`` never
gets ours by accident, and ``pip install torch_xla==2.9.0+gitc04e61c.p1a2b3c4d`` names one
exact build. The same inputs always give the same label (no dates, no build numbers).

The provenance file (``xla_host.provenance``: its path, its schema, and why it records
the wheel's inputs only) is added to the built wheel (with its RECORD line), because
upstream's setup.py lists only ``lib/*.so*`` and ``py.typed`` as package data: a file
written into the source tree would not be packed.

Reproducible bytes: both wheels are re-packed by :func:`repack_wheel` (sorted entries,
dates from SOURCE_DATE_EPOCH, fixed modes, sorted JSON), so the packing adds no
variation of its own; what the compiler makes is what remains. Re-packing the whole
wheel, rather than trusting each upstream ``setup.py bdist_wheel`` to honour
SOURCE_DATE_EPOCH and the umask, makes this hold for any setuptools/wheel version.
"""

from __future__ import annotations

import base64
import calendar
import csv
import hashlib
import io
import os
import re
import shutil
import stat
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from xla_host import filemode
from xla_host.provenance import PROVENANCE_PATH, Provenance
from xla_host.wheel_filename import parse_wheel_name

_LOCAL_LABEL = re.compile(r"[a-z0-9]+(\.[a-z0-9]+)*")


def patch_digest(parts: Sequence[str]) -> str:
    """8 hex digits over the ordered series digests (and pins) that shape one wheel."""
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part.encode() + b"\n")
    return hasher.hexdigest()[:8]


def local_version(public: str, commit: str, digest: str | None) -> str:
    """``2.9.0`` + ``c04e61c...`` + ``1a2b3c4d`` -> ``2.9.0+gitc04e61c.p1a2b3c4d``.

    ``digest`` None means nothing was patched into this wheel: the label is then exactly
    upstream's own ``+git<sha7>`` (a torch built unpatched at the pinned commit is the
    same build upstream's recipe makes).
    """
    label = f"git{commit[:7]}" + (f".p{digest}" if digest else "")
    if not _LOCAL_LABEL.fullmatch(label):
        raise ValueError(f"local version label {label!r} is not PEP 440 [a-z0-9.]")
    return f"{public}+{label}"


def record_hash(data: bytes) -> str:
    """RECORD's spelling of ``data``'s digest: ``sha256=<urlsafe base64, unpadded>``."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


#: zip stores local time from 1980-01-01 on; an earlier SOURCE_DATE_EPOCH is clamped to it.
ZIP_EPOCH_FLOOR = 315532800


def epoch_from(env: Mapping[str, str]) -> int:
    """SOURCE_DATE_EPOCH from ``env`` (https://reproducible-builds.org/specs/source-date-epoch/).

    Without it (a spec written before it was set): the zip floor, which is as fixed.
    """
    value = env.get("SOURCE_DATE_EPOCH", "")
    return int(value) if value.strip().isdigit() else ZIP_EPOCH_FLOOR


def _order(filename: str, record_name: str) -> tuple[int, str]:
    # As bdist_wheel writes them: the package first, then .dist-info, RECORD last.
    if filename == record_name:
        return (2, filename)
    return (1 if filename.split("/", 1)[0].endswith(".dist-info") else 0, filename)


def _entry(filename: str, epoch: int, executable: bool) -> zipfile.ZipInfo:
    # UTC, never before zip's 1980 floor; zip keeps seconds // 2, so an odd second rounds down.
    info = zipfile.ZipInfo(filename, date_time=time.gmtime(max(epoch, ZIP_EPOCH_FLOOR))[:6])
    info.create_system = 3  # unix: external_attr holds the mode
    if filename.endswith("/"):
        info.external_attr = (stat.S_IFDIR | 0o755) << 16 | 0x10
        info.compress_type = zipfile.ZIP_STORED
    else:
        mode = 0o755 if executable else 0o644
        info.external_attr = (stat.S_IFREG | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
    return info


def repack_wheel(
    source: Path, target: Path, epoch: int, files: Mapping[str, bytes] | None = None
) -> Path:
    """Write ``source`` (plus ``files``, added or replacing) to ``target``, reproducibly.

    The same entries always give the same bytes, whatever the build tree's mtimes, umask
    or directory order: entries sorted (package, then ``.dist-info``, RECORD last), every
    date from ``epoch``, modes 0644 (0755 where the built file was executable, as
    torch's ``bin/torch_shm_manager``), zlib's default deflate level, RECORD sorted
    with the hashes of the added files. Written to a temporary file next to ``target`` and
    renamed over it (a crash leaves the old file), with the mode the umask gives.
    """
    files = dict(files or {})
    with zipfile.ZipFile(source) as archive:
        infos = {info.filename: info for info in archive.infolist()}
        record_name = next(
            (name for name in infos if re.fullmatch(r"[^/]+\.dist-info/RECORD", name)), None
        )
        if record_name is None:
            raise ValueError(f"{source} has no .dist-info/RECORD: not a wheel")
        record = [
            row
            for row in csv.reader(io.StringIO(archive.read(record_name).decode()))
            if row and row[0] not in files and row[0] != record_name
        ]
        record += [[name, record_hash(data), str(len(data))] for name, data in files.items()]
        record_text = io.StringIO()
        csv.writer(record_text, lineterminator="\n").writerows(
            [*sorted(record), [record_name, "", ""]]
        )
        names = sorted({*infos, *files, record_name}, key=lambda n: _order(n, record_name))
        handle, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        os.close(handle)
        try:
            with zipfile.ZipFile(tmp_name, "w") as out:
                for name in names:
                    old = infos.get(name)
                    executable = old is not None and bool((old.external_attr >> 16) & 0o111)
                    entry = _entry(name, epoch, executable and name not in files)
                    if name == record_name:
                        out.writestr(entry, record_text.getvalue())
                    elif name in files:
                        out.writestr(entry, files[name])
                    elif name.endswith("/"):
                        out.writestr(entry, b"")
                    else:
                        assert old is not None
                        entry.file_size = old.file_size
                        with (
                            archive.open(old) as src,
                            out.open(
                                entry, "w", force_zip64=old.file_size >= zipfile.ZIP64_LIMIT
                            ) as dst,
                        ):
                            shutil.copyfileobj(src, dst, 1 << 20)
            filemode.as_if_created(Path(tmp_name))
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
    return target


SBOM_NAME = "xla-wheels.cdx.json"
"""Our CycloneDX SBOM's file name, in ``<name>-<version>.dist-info/sboms/`` (PEP 770); the
document is written by ``xla_wheels.sbom``, on the host."""

_SBOM_PATH = re.compile(rf"[^/]+\.dist-info/sboms/{re.escape(SBOM_NAME)}")


def sbom_path_in(wheel: Path) -> str | None:
    """Where ``wheel`` holds our SBOM, or None when it holds none (or is not a zip)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            return next((n for n in archive.namelist() if _SBOM_PATH.fullmatch(n)), None)
    except (OSError, zipfile.BadZipFile):
        return None


def add_file_to_wheel(wheel: Path, arcname: str, data: bytes, epoch: int = ZIP_EPOCH_FLOOR) -> None:
    """Add (or replace) ``arcname`` in ``wheel`` and its RECORD line; see repack_wheel."""
    repack_wheel(wheel, wheel, epoch, {arcname: data})


def with_build_tag(wheel: Path, build_tag: str) -> Path:
    """A copy of ``wheel`` with PEP 427 build tag ``build_tag``: ``name-ver-TAG-py-abi-plat``.

    The file name carries the tag and ``.dist-info/WHEEL`` its ``Build:`` line (the
    ``.dist-info`` directory name has no build tag). Entry dates stay the wheel's own.
    Returns the new file, next to the old.
    """
    if not re.fullmatch(r"[0-9]+", build_tag):
        raise ValueError(f"build tag {build_tag!r} is not a number")
    tagged_name = parse_wheel_name(wheel.name).with_build(build_tag)
    with zipfile.ZipFile(wheel) as archive:
        wheel_file = next(
            n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/WHEEL", n)
        )
        epoch = calendar.timegm((*archive.infolist()[0].date_time, 0, 0, 0))
        lines = [
            line
            for line in archive.read(wheel_file).decode().splitlines()
            if not line.startswith("Build:")
        ]
    text = "\n".join([*lines, f"Build: {build_tag}"]) + "\n"
    return repack_wheel(wheel, wheel.with_name(tagged_name), epoch, {wheel_file: text.encode()})


def stamp_provenance(wheel: Path, provenance: Provenance, epoch: int = ZIP_EPOCH_FLOOR) -> None:
    """Write the provenance into the torch_xla wheel at :data:`PROVENANCE_PATH`.

    The whole wheel is re-packed reproducibly on the way (see :func:`repack_wheel`).
    """
    add_file_to_wheel(wheel, PROVENANCE_PATH, provenance.to_bytes(), epoch)


def read_provenance(wheel: Path) -> Provenance:
    with zipfile.ZipFile(wheel) as archive:
        return Provenance.from_bytes(archive.read(PROVENANCE_PATH))
