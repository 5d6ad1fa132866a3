"""Why a run missed the persistent cache: its keys' components against a pack's.

A **key record** (``key-record`` 1) is what a run recorded about the keys it took
(``child_workload.py``'s ``train --record-keys``): the run's components (compile options
as XLA parses them, the switches that shape the module, the platform, the revisions),
the topology, and for each graph it brought: the canonical fingerprint of the module
(``gate/hlo_canonical.py``, as the key probe's children compute it), the sync's
persistent-cache hits and misses and the entry files it wrote. The gate writes one for
the pack it makes (``keys.json`` beside its report; a pack's manifest carries its
``keys``), ``cache record`` for any run of a workload.

:func:`explain` takes each graph the run missed and looks for an entry of the reference
(a pack's manifest, or the packs installed in a cache directory) with the same module:
none means the **module** differs (and the switches that shape it are named); one with
the same module means the key's other side differs, and each component that differs is
named: **compile options**, **platform version**, **topology**, **revisions**.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xla_host import cache_pack

#: The components of a key besides the module, as explanations name them.
COMPONENTS = {
    "compile_options": "compile options",
    "platform": "platform version",
    "topology": "topology",
    "revisions": "revisions",
}


@dataclass(frozen=True)
class Reference:
    """What a run is compared with: one pack's keys."""

    source: str
    keys: Mapping[str, Any]


@dataclass
class Explanation:
    step: int
    module: str
    misses: int
    components: list[str] = field(default_factory=list)
    """The components that differ: ``module``, ``compile options``, ... (empty: none
    recorded differs)."""
    details: list[str] = field(default_factory=list)
    against: str = ""

    def line(self) -> str:
        what = ", ".join(self.components) or "no recorded component"
        head = f"step {self.step} (module {self.module[7:23]}…, {self.misses} miss(es)): {what}"
        return (
            head
            + (f" differs from {self.against}" if self.against else "")
            + "".join(f"\n    {detail}" for detail in self.details)
        )


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_flat(inner, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def component_differences(
    ours: Mapping[str, Any], theirs: Mapping[str, Any], topology: tuple[str, str]
) -> tuple[list[str], list[str]]:
    """The components (in words) that differ between a run's and a reference's, and one
    line per differing field (``compile_options.xla_flags.xla_cpu_enable_fast_math: the
    pack's false, the run's true``)."""
    names: list[str] = []
    details: list[str] = []
    for key, words in COMPONENTS.items():
        if key == "topology":
            mine, other = {"topology": topology[0]}, {"topology": topology[1]}
        else:
            mine, other = _flat(ours.get(key, {}), key), _flat(theirs.get(key, {}), key)
        moved = sorted(k for k in set(mine) | set(other) if mine.get(k) != other.get(k))
        if moved:
            names.append(words)
            details.extend(
                f"{k}: the reference's {other.get(k, 'unset')}, the run's {mine.get(k, 'unset')}"
                for k in moved
            )
    return names, details


def explain(record: Mapping[str, Any], references: Sequence[Reference]) -> list[Explanation]:
    """One explanation per graph of ``record`` that missed the cache."""
    found = []
    for graph in record["graphs"]:
        if int(graph.get("misses", 0)) <= 0:
            continue
        item = Explanation(int(graph["step"]), str(graph["module"]), int(graph["misses"]))
        same_module = [
            ref for ref in references
            if any(e.get("module") == graph["module"] for e in ref.keys.get("entries", {}).values())
        ]  # fmt: skip
        candidates = same_module or list(references)
        if not candidates:
            item.details.append("nothing to compare with: no pack with recorded keys")
            found.append(item)
            continue
        # The closest reference: the one whose components differ least.
        best = min(
            candidates,
            key=lambda ref: len(_diff(record, ref)[1]),
        )
        names, details = _diff(record, best)
        if not same_module:
            switches = _flat(record["components"].get("module_switches", {}), "module_switches")
            theirs = _flat(best.keys["components"].get("module_switches", {}), "module_switches")
            moved = sorted(
                k for k in set(switches) | set(theirs) if switches.get(k) != theirs.get(k)
            )
            names = ["module", *names]
            details = [
                "no entry of the reference was compiled from this module"
                + (": switches that shape the module differ" if moved else ""),
                *(
                    f"{k}: the reference's {theirs.get(k, 'unset')}, the run's "
                    f"{switches.get(k, 'unset')}"
                    for k in moved
                ),  # fmt: skip
                *details,
            ]
        elif not names:
            details.append(
                "every recorded component is equal: the reference's entry for this module "
                "is absent from the cache directory, or the key takes an input not recorded"
            )
        item.components, item.details, item.against = names, details, best.source
        found.append(item)
    return found


def _diff(record: Mapping[str, Any], ref: Reference) -> tuple[list[str], list[str]]:
    return component_differences(
        record["components"], ref.keys["components"],
        (str(record.get("topology")), str(ref.keys.get("topology"))),
    )  # fmt: skip


def references_of_cache(cache: Path) -> list[Reference]:
    """The packs installed into a cache directory, with their keys, as references."""
    return [
        Reference(
            f"pack {manifest.workload.get('name')} installed in {cache} ({path.name})",
            manifest.keys,
        )  # fmt: skip
        for path, manifest in cache_pack.installed_manifests(cache)
        if manifest.keys is not None
    ]
