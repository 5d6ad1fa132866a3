"""Compare the provenance file inside an installed torch_xla with wheels.lock.

The build stage writes ``torch_xla/_xla_wheels_provenance.json``: the wheel's inputs
(commits, patch digests, toolchain; see ``builder.stamp`` on identity). This reader
accepts the shapes that carry those facts (``commits: {name: sha}`` or ``components:
{name: {commit, series_sha256, ...}}``, or a top-level ``patches`` list of ``{path,
sha256}``) and reports what it compared, so a layout change shows up as "nothing
compared" rather than as a silent pass. A bundle name or manifest digest is never judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROVENANCE_PATH = "torch_xla/_xla_wheels_provenance.json"


@dataclass
class ProvenanceCheck:
    compared: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _commit_of(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        commit = value.get("commit")
        return commit if isinstance(commit, str) else None
    return None


def _key(data: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if name in data:
            return data[name]
    return None


def compare(
    provenance: Mapping[str, Any], bundle_name: str, entry: Mapping[str, Any]
) -> ProvenanceCheck:
    """Every fact of the provenance that the lock also records, compared."""
    check = ProvenanceCheck()
    # Identity is the inputs, never a bundle name: a wheel shared by bundles with the same
    # inputs (a libtpu bump) carries the inputs of all of them. A ``bundle`` or
    # ``manifest_sha256`` field (wheels built before this rule) is therefore not judged.
    _compare_version(provenance, entry, check)
    locked = entry.get("components", {})
    components = _key(provenance, "components", "commits") or {}
    if isinstance(components, Mapping):
        for name, value in sorted(components.items()):
            commit = _commit_of(value)
            if name not in locked or not commit:
                continue
            check.compared.append(f"{name} commit")
            expected = str(locked[name].get("commit", ""))
            # Either side may be abbreviated (a short pin not resolved yet, a sha7 label).
            if not expected or not (expected.startswith(commit) or commit.startswith(expected)):
                check.problems.append(
                    f"{name} commit is {commit}, wheels.lock has {expected or 'none'}"
                )
            if isinstance(value, Mapping):
                digest = _key(value, "series_sha256", "patch-series-sha256", "patch_series_sha256")
                if isinstance(digest, str):
                    check.compared.append(f"{name} patch series")
                    if digest != locked[name].get("patch-series-sha256"):
                        check.problems.append(
                            f"{name} patch series sha256 is {digest}, wheels.lock has "
                            f"{locked[name].get('patch-series-sha256')}"
                        )

    patches = provenance.get("patches")
    if isinstance(patches, list):
        locked_patches = {
            p["path"]: p["sha256"]
            for component in locked.values()
            for p in component.get("patches", [])
        }
        for patch in patches:
            if not isinstance(patch, Mapping) or "sha256" not in patch:
                continue
            path = str(patch.get("path", ""))
            if not path.startswith("patches/"):
                path = f"patches/{path}"
            check.compared.append(path)
            if locked_patches.get(path) != patch["sha256"]:
                check.problems.append(
                    f"{path} sha256 is {patch['sha256']}, wheels.lock has "
                    f"{locked_patches.get(path, 'no such patch')}"
                )
    return check


def _compare_version(
    provenance: Mapping[str, Any], entry: Mapping[str, Any], check: ProvenanceCheck
) -> None:
    """The provenance's torch_xla version is the one of the locked torch_xla wheel."""
    version = provenance.get("torch_xla_version")
    locked = [
        str(w["name"]).split("-")[1]
        for w in entry.get("wheels", [])
        if str(w.get("name", "")).split("-")[0] in ("torch_xla", "torch-xla")
    ]
    if not isinstance(version, str) or not locked:
        return
    check.compared.append("torch_xla version")
    if version not in locked:
        check.problems.append(
            f"torch_xla version is {version}, wheels.lock has {', '.join(locked)}"
        )
