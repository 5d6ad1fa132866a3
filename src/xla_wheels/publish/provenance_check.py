"""Compare the provenance inside an installed torch_xla with the bundle's wheels.lock entry.

Both sides are typed: the provenance follows the one schema of ``xla_host.provenance``
(written by the build stage's stamp step), the entry is ``wheels_lock.BundleEntry``. What
was compared is reported, so a check that compared nothing never reads as a pass.

Identity is the inputs, never a bundle name (see ``builder.stamp``): a wheel shared by
bundles with the same inputs (a libtpu bump) carries the inputs of all of them, so the
provenance holds no bundle, manifest digest or remote to judge. A wheel built before that
rule still carries those fields; the schema reads it and ignores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xla_host.provenance import Provenance
from xla_host.wheel_filename import normalize, parse_wheel_name
from xla_wheels.wheels_lock import BundleEntry


@dataclass
class ProvenanceCheck:
    compared: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def compare(provenance: Provenance, bundle_name: str, entry: BundleEntry) -> ProvenanceCheck:
    """Every input of the provenance that the bundle's lock entry also records, compared."""
    check = ProvenanceCheck()
    _compare_version(provenance, bundle_name, entry, check)
    for name, built in sorted(provenance.components.items()):
        locked = entry.components.get(name)
        if locked is None:
            check.problems.append(
                f"{name} is in the provenance but not in wheels.lock ({bundle_name})"
            )
            continue
        check.compared.append(f"{name} commit")
        # Either side may be abbreviated (a short pin not resolved yet when locked).
        if not locked.commit or not (
            locked.commit.startswith(built.commit) or built.commit.startswith(locked.commit)
        ):
            check.problems.append(
                f"{name} commit is {built.commit}, wheels.lock ({bundle_name}) has "
                f"{locked.commit or 'none'}"
            )
        check.compared.append(f"{name} patch series")
        if built.series_sha256 != locked.series_sha256:
            check.problems.append(
                f"{name} patch series sha256 is {built.series_sha256}, wheels.lock "
                f"({bundle_name}) has {locked.series_sha256}"
            )
        locked_patches = {patch.path: patch.sha256 for patch in locked.patches}
        for patch in built.patches:
            check.compared.append(patch.path)
            if locked_patches.get(patch.path) != patch.sha256:
                check.problems.append(
                    f"{patch.path} sha256 is {patch.sha256}, wheels.lock ({bundle_name}) has "
                    f"{locked_patches.get(patch.path, 'no such patch')}"
                )
    return check


def _compare_version(
    provenance: Provenance, bundle_name: str, entry: BundleEntry, check: ProvenanceCheck
) -> None:
    """The provenance's torch_xla version is the one of the locked torch_xla wheel."""
    version = provenance.torch_xla_version
    locked = [
        parsed.version
        for parsed in (parse_wheel_name(wheel.name) for wheel in entry.wheels or ())
        if parsed.normalized == normalize("torch_xla")
    ]
    if version is None or not locked:
        return
    check.compared.append("torch_xla version")
    if version not in locked:
        check.problems.append(
            f"torch_xla version is {version}, wheels.lock ({bundle_name}) has "
            f"{', '.join(locked)}"
        )
