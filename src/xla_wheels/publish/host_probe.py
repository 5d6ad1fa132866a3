"""What an interpreter has installed, read without importing torch: one probe script.

``doctor`` runs it in a training host's interpreter, ``verify-install`` in a fresh venv.
It reads package metadata and our provenance file (:data:`PROVENANCE_PATH`) as files, so
a torch_xla that fails to import still leaves its versions and provenance in the report.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xla_wheels.provenance import PROVENANCE_PATH, Provenance, ProvenanceFormatError
from xla_wheels.publish.errors import PublishError

_SCRIPT = r"""
import importlib.metadata as md, json, sys
out = {"python": sys.executable, "version": "%d.%d" % sys.version_info[:2], "versions": {},
       "locations": {}, "provenance": None, "provenance_path": None, "provenance_error": None,
       "imported": sorted(m for m in sys.modules if m.startswith("torch"))}
for name in sys.argv[2:]:
    try:
        dist = md.distribution(name)
        out["versions"][name] = dist.version
        out["locations"][name] = str(dist.locate_file(""))
    except md.PackageNotFoundError:
        out["versions"][name] = None
try:
    path = md.distribution("torch_xla").locate_file(sys.argv[1])
    if path.is_file():
        out["provenance_path"] = str(path)
        out["provenance"] = json.loads(path.read_text())
except md.PackageNotFoundError:
    pass
except (ValueError, OSError) as error:
    out["provenance_error"] = str(error)
print(json.dumps(out))
"""


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
    """Run the probe in ``python``; a failure is a :class:`PublishError` with ``fix``."""
    try:
        result = subprocess.run(
            [python, "-c", _SCRIPT, PROVENANCE_PATH, *packages],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PublishError(f"cannot run the interpreter {python}: {error}", fix=fix) from None
    if result.returncode != 0:
        raise PublishError(
            f"{python} could not read its installed packages: {result.stderr.strip()[-400:]}",
            fix=fix,
        )
    data = json.loads(result.stdout)
    return HostFacts(
        python=data["python"],
        version=data["version"],
        versions=data["versions"],
        locations=data["locations"],
        provenance_path=data["provenance_path"],
        provenance_raw=data["provenance"],
        provenance_error=data["provenance_error"],
        imported=tuple(data["imported"]),
    )
