"""A host's persistent cache directory: what it holds (``cache size``) and what may go
(``cache prune``).

An **entry** is a regular file whose name is a key's hash as torch_xla writes it (hex or
decimal digits, at least 8): anything else in the directory (a user's notes, a writer
lease, temporary files, ``.xla-packs/``) is reported apart and never removed. An entry is
**kept** when a pack installed into the directory names it (``.xla-packs/``, written by
``cache fetch``), when a key record given with ``--keep-run`` names it (a run's entries),
or when it was written within ``--recent-days`` (its modification time: torch_xla writes
an entry once, when it compiles; access times are not used, mounts with ``noatime`` or
``relatime`` do not keep them). Every other entry is **unreferenced**: ``cache prune``
lists them and removes them only with ``--apply`` (without it, a dry run that changes
nothing). An entry that changed since it was listed is left alone.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from xla_host import cache_pack
from xla_host.errors import UsageError

ENTRY = re.compile(r"[0-9A-Fa-f]{8,128}")


@dataclass
class Survey:
    cache: Path
    kept: dict[str, str] = field(default_factory=dict)
    """Entry name -> why it is kept."""
    unreferenced: list[str] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    mtimes: dict[str, int] = field(default_factory=dict)
    others: list[str] = field(default_factory=list)
    """Names that are not entries (left alone)."""
    packs: dict[str, int] = field(default_factory=dict)
    """Installed pack (its record) -> how many of its entries are present."""

    def total(self, names: Iterable[str]) -> int:
        return sum(self.sizes[n] for n in names)

    def lines(self) -> list[str]:
        entries = sorted(self.sizes)
        rows = [
            f"{self.cache}: {len(entries)} entr(ies), {self.total(entries):,} bytes",
            f"  kept: {len(self.kept)} ({self.total(self.kept):,} bytes)",
        ]
        reasons: dict[str, int] = {}
        for why in self.kept.values():
            reasons[why] = reasons.get(why, 0) + 1
        rows += [f"    {count} {why}" for why, count in sorted(reasons.items())]
        rows.append(
            f"  unreferenced: {len(self.unreferenced)} "
            f"({self.total(self.unreferenced):,} bytes)"
        )
        rows += [f"  installed pack {name}: {count} entr(ies) present"
                 for name, count in sorted(self.packs.items())]  # fmt: skip
        if self.others:
            shown = ", ".join(self.others[:5]) + (" …" if len(self.others) > 5 else "")
            rows.append(f"  not cache entries (never removed): {len(self.others)}: {shown}")
        return rows


def _run_entries(path: Path) -> set[str]:
    fix = "pass a key record (`cache record --out FILE`, or a gate run's keys.json)"
    try:
        data = json.loads(path.read_text())
        return {name for graph in data["graphs"] for name in graph.get("entries", ())}
    except OSError as error:
        raise UsageError(f"--keep-run {path} cannot be read: {error.strerror}", fix=fix) from None
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"--keep-run {path} is not a key record", fix=fix) from None


def survey(
    cache: Path, keep_runs: Iterable[Path] = (), recent_days: float = 7.0,
    now: float | None = None,
) -> Survey:  # fmt: skip
    """What ``cache`` holds and which entries are kept, and why; reads only."""
    if not cache.is_dir():
        raise UsageError(f"{cache} is not a directory", fix="pass the cache directory (--cache)")
    found = Survey(cache)
    by_pack: dict[str, set[str]] = {}
    for path, manifest in cache_pack.installed_manifests(cache):
        label = f"{manifest.workload.get('name')}/{manifest.topology} ({path.stem[:12]})"
        by_pack[label] = {e.name for e in manifest.entries}
    by_run = {str(p): _run_entries(p) for p in keep_runs}
    horizon = (time.time() if now is None else now) - recent_days * 86400
    for child in sorted(cache.iterdir()):
        info = child.lstat()
        if not ENTRY.fullmatch(child.name) or not stat.S_ISREG(info.st_mode):
            if child.name != cache_pack.INSTALLED_DIR:
                found.others.append(child.name)
            continue
        found.sizes[child.name] = info.st_size
        found.mtimes[child.name] = info.st_mtime_ns
        why = next((f"named by installed pack {label}" for label, names in by_pack.items()
                    if child.name in names), None)  # fmt: skip
        why = why or next((f"named by run {run}" for run, names in by_run.items()
                           if child.name in names), None)  # fmt: skip
        if why is None and info.st_mtime >= horizon:
            why = f"written within {recent_days:g} day(s)"
        if why is None:
            found.unreferenced.append(child.name)
        else:
            found.kept[child.name] = why
    found.packs = {label: len(names & set(found.sizes)) for label, names in by_pack.items()}
    return found


def prune(found: Survey) -> list[str]:
    """Remove the unreferenced entries of ``found``; an entry that changed since it was
    surveyed (another size or time: a process wrote it again) is left alone."""
    removed = []
    for name in found.unreferenced:
        path = found.cache / name
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_size != found.sizes[name]
            or info.st_mtime_ns != found.mtimes[name]
        ):
            continue
        os.unlink(path)
        removed.append(name)
    return removed
