"""Version stamp and provenance: a patched wheel can never pass for a stock one.

The local version label carries the source commit and a digest of everything patched into
the wheel: ``2.9.0+gitc04e61c.p1a2b3c4d``. PEP 440 local labels allow ``[a-z0-9.]``, and
pip orders ``2.9.0+...`` after ``2.9.0``, so a host that pins ``torch_xla==2.9.0`` never
gets ours by accident, and ``pip install torch_xla==2.9.0+gitc04e61c.p1a2b3c4d`` names one
exact build. The same inputs always give the same label (no dates, no build numbers).

The provenance file (``xla_wheels.provenance``: its path and schema) is added to the built
wheel (with its RECORD line), because upstream's setup.py lists only ``lib/*.so*`` and
``py.typed`` as package data: a file written into the source tree would not be packed.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from xla_wheels.provenance import PROVENANCE_PATH, Provenance

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


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def add_file_to_wheel(wheel: Path, arcname: str, data: bytes) -> None:
    """Add (or replace) ``arcname`` in ``wheel`` and its ``*.dist-info/RECORD`` line.

    The wheel is rewritten to a temporary file next to it and renamed over it, so a crash
    leaves the old wheel, never half a zip. Entries keep their order and timestamps.
    """
    with zipfile.ZipFile(wheel) as source:
        infos = source.infolist()
        record_name = next(
            (i.filename for i in infos if re.fullmatch(r"[^/]+\.dist-info/RECORD", i.filename)),
            None,
        )
        if record_name is None:
            raise ValueError(f"{wheel} has no .dist-info/RECORD: not a wheel")
        record_lines = [
            line
            for line in source.read(record_name).decode().splitlines()
            if line and not line.startswith((f"{arcname},", f"{record_name},"))
        ]
        record_lines += [f"{arcname},{_record_hash(data)},{len(data)}", f"{record_name},,"]
        handle, tmp_name = tempfile.mkstemp(dir=wheel.parent, prefix=f".{wheel.name}.")
        os.close(handle)
        try:
            with zipfile.ZipFile(tmp_name, "w", zipfile.ZIP_DEFLATED) as target:
                for info in infos:
                    if info.filename in (arcname, record_name):
                        continue
                    target.writestr(info, source.read(info.filename))
                added = zipfile.ZipInfo(arcname, date_time=infos[0].date_time)
                added.external_attr = 0o644 << 16
                target.writestr(added, data, zipfile.ZIP_DEFLATED)
                record_info = zipfile.ZipInfo(record_name, date_time=infos[0].date_time)
                record_info.external_attr = 0o644 << 16
                target.writestr(record_info, "\n".join(record_lines) + "\n", zipfile.ZIP_DEFLATED)
            os.replace(tmp_name, wheel)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise


def stamp_provenance(wheel: Path, provenance: Provenance) -> None:
    """Write the provenance into the torch_xla wheel at :data:`PROVENANCE_PATH`."""
    add_file_to_wheel(wheel, PROVENANCE_PATH, provenance.to_bytes())


def read_provenance(wheel: Path) -> Provenance:
    with zipfile.ZipFile(wheel) as archive:
        return Provenance.from_bytes(archive.read(PROVENANCE_PATH))
