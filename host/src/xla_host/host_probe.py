"""What an interpreter has installed, and the provenance of its torch_xla, without importing.

``doctor`` asks a training host's interpreter, ``verify-install`` a fresh venv, through the
one metadata probe (:mod:`xla_host.installed_metadata`); our provenance file
(:data:`PROVENANCE_PATH`) is read as a file next to the installed package, so a torch_xla
that fails to import still leaves its versions and provenance in the report.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_host.installed_metadata import ProbeFailed, read_installed
from xla_host.provenance import PROVENANCE_PATH, Provenance, ProvenanceFormatError


@dataclass(frozen=True)
class HostFacts:
    python: str
    version: str
    """``major.minor`` of the interpreter."""
    versions: Mapping[str, str | None]
    locations: Mapping[str, str]
    provenance_path: str | None
    """None: the installed torch_xla has no provenance file (or there is no torch_xla)."""
    provenance_raw: Any
    provenance_error: str | None
    imported: tuple[str, ...]
    """torch modules already imported at start-up (a site hook importing torch)."""

    def provenance(self) -> Provenance | None:
        """The parsed provenance; raises :class:`ProvenanceFormatError` when malformed."""
        if self.provenance_error is not None:
            raise ProvenanceFormatError(self.provenance_error)
        if self.provenance_path is None:
            return None
        return Provenance.from_json(self.provenance_raw)


def probe(python: str, packages: Sequence[str], *, fix: str, timeout: float = 120) -> HostFacts:
    """Run the probe in ``python``; a failure is a :class:`ProbeFailed` with ``fix``."""
    try:
        installed = read_installed(python, [*packages, "torch_xla"], timeout=timeout)
    except ProbeFailed as error:
        raise type(error)(error.message, fix=fix) from None  # its exit code kept
    provenance_path = provenance_error = raw = None
    torch_xla = installed.dists.get("torch_xla")
    if torch_xla is not None:
        # Read as a file, next to the installed package: no import of torch_xla needed.
        path = Path(torch_xla.site) / PROVENANCE_PATH
        try:
            if path.is_file():
                provenance_path, raw = str(path), json.loads(path.read_text())
        except (ValueError, OSError) as error:
            provenance_error = str(error)
    return HostFacts(
        python=installed.python,
        version=installed.version,
        versions={name: installed.version_of(name) for name in packages},
        locations={name: dist.site for name, dist in installed.dists.items() if name in packages},
        provenance_path=provenance_path,
        provenance_raw=raw,
        provenance_error=provenance_error,
        imported=installed.imported,
    )
