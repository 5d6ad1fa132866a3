"""Compare the provenance inside an installed torch_xla with the bundle's wheels.lock entry.

Both sides are typed: the provenance follows the one schema of ``xla_wheels.provenance``
(written by the build stage's stamp step), the entry is ``lockfile.BundleEntry``. What
was compared is reported, so a check that compared nothing never reads as a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xla_wheels.lockfile import BundleEntry
from xla_wheels.provenance import PROVENANCE_PATH, Provenance

__all__ = ["PROVENANCE_PATH", "ProvenanceCheck", "compare"]


@dataclass
class ProvenanceCheck:
    compared: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def compare(provenance: Provenance, bundle_name: str, entry: BundleEntry) -> ProvenanceCheck:
    """Every fact of the provenance that the lock also records, compared."""
    check = ProvenanceCheck()
    check.compared.append("bundle")
    if provenance.bundle != bundle_name:
        check.problems.append(f"bundle is {provenance.bundle!r}, expected {bundle_name!r}")
    check.compared.append("manifest sha256")
    if provenance.manifest_sha256 != entry.manifest_sha256:
        check.problems.append(
            f"built from manifest sha256 {provenance.manifest_sha256}, wheels.lock has "
            f"{entry.manifest_sha256}"
        )
    for name, built in sorted(provenance.components.items()):
        locked = entry.components.get(name)
        if locked is None:
            check.problems.append(f"{name} is in the provenance but not in wheels.lock")
            continue
        check.compared.append(f"{name} commit")
        # Either side may be abbreviated (a short pin not resolved yet when locked).
        if not locked.commit or not (
            locked.commit.startswith(built.commit) or built.commit.startswith(locked.commit)
        ):
            check.problems.append(
                f"{name} commit is {built.commit}, wheels.lock has {locked.commit or 'none'}"
            )
        check.compared.append(f"{name} patch series")
        if built.series_sha256 != locked.series_sha256:
            check.problems.append(
                f"{name} patch series sha256 is {built.series_sha256}, wheels.lock has "
                f"{locked.series_sha256}"
            )
        locked_patches = {patch.path: patch.sha256 for patch in locked.patches}
        for patch in built.patches:
            check.compared.append(patch.path)
            if locked_patches.get(patch.path) != patch.sha256:
                check.problems.append(
                    f"{patch.path} sha256 is {patch.sha256}, wheels.lock has "
                    f"{locked_patches.get(patch.path, 'no such patch')}"
                )
    return check
