"""A host's persistent cache directory: what it holds (``cache size``) and what may go
(``cache prune``).

An **entry** is what torch_xla's persistent cache writes with patch 0004: a regular file
whose name is a key's hash (hex or decimal digits, at least 8) and whose last 24 bytes
are the entry footer, the magic ``XLAPCF01`` then the payload's length (the size before
the footer) as uint64 little-endian (the checksum after it is not read: a prune reads 24
bytes of each file, not the cache). Anything else in the directory (a user's notes, a
writer lease, temporary files, ``.xla-packs/``, a stock build's entries, which have no
footer, a git object) is listed apart and never removed; a directory with files of which
none is an entry, and no pack installed, is no persistent cache: ``cache prune --apply``
refuses it (exit 2) and removes nothing.

An entry is **kept** when a pack installed into the directory names it (``.xla-packs/``,
written by ``cache fetch`` before it links the entries), when a key record given with
``--keep-run`` names it (a run's entries), or when it was written within
``--recent-days`` (its modification time: torch_xla writes an entry once, when it
compiles; access times are not used, mounts with ``noatime`` or ``relatime`` do not keep
them). While an install record cannot be read (damaged, empty, not a file), what it names
is unknown, so every entry is kept and the report says which record to repair. Every
other entry is **unreferenced**: ``cache prune`` lists them and removes them only with
``--apply`` (without it, a dry run that changes nothing). ``--apply`` holds the install
lock (``cache_pack.install_lock``) from listing to removing, so a ``cache fetch`` records
and links a pack either wholly before the listing or after the removal; an entry that
changed since it was listed is left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from xla_host import cache_pack
from xla_host.errors import UsageError
from xla_host.filemode import NotARegularFile, open_shared, read_shared
from xla_host.tables import loads_json

ENTRY = re.compile(r"[0-9A-Fa-f]{8,128}")
#: The footer patch 0004 ends each entry with: this magic, the payload's length, its
#: FNV-1a hash (both uint64 little-endian).
FOOTER_MAGIC = b"XLAPCF01"
FOOTER_BYTES = len(FOOTER_MAGIC) + 8 + 8


def is_entry(path: Path, info: os.stat_result) -> bool:
    """``path`` (whose ``lstat`` is ``info``) is a persistent cache entry (module doc)."""
    if not ENTRY.fullmatch(path.name) or not stat.S_ISREG(info.st_mode):
        return False
    if info.st_size < FOOTER_BYTES:
        return False
    try:
        with open_shared(path, what="cache entry") as handle:
            handle.seek(info.st_size - FOOTER_BYTES)
            footer = handle.read(FOOTER_BYTES)
    except (OSError, NotARegularFile):
        return False  # gone, unreadable or replaced since the listing: not removed
    length = int.from_bytes(footer[len(FOOTER_MAGIC) : len(FOOTER_MAGIC) + 8], "little")
    return footer.startswith(FOOTER_MAGIC) and length == info.st_size - FOOTER_BYTES


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
    unreadable: list[tuple[Path, str]] = field(default_factory=list)
    """Install records that cannot be read, and why: every entry is kept while one is."""

    def total(self, names: Iterable[str]) -> int:
        return sum(self.sizes[n] for n in names)

    @property
    def is_a_cache(self) -> bool:
        """The directory shows it is a persistent cache: an entry, a pack installed, or
        nothing in it at all (nothing to remove)."""
        return bool(self.sizes or self.packs or self.unreadable or not self.others)

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
        rows += [
            f"  install record {path} {problem}: every entry is kept until it is repaired "
            f"or removed (it names entries a pack installed; `cache fetch` of that pack "
            "again writes it anew)"
            for path, problem in self.unreadable
        ]
        if self.others:
            shown = ", ".join(self.others[:5]) + (" …" if len(self.others) > 5 else "")
            rows.append(f"  not cache entries (never removed): {len(self.others)}: {shown}")
        return rows


def _run_entries(path: Path) -> set[str]:
    fix = "pass a key record (`cache record --out FILE`, or a gate run's keys.json)"
    try:
        raw = read_shared(path, what="key record")
        data = loads_json(raw, source=f"--keep-run {path}", error=UsageError, fix=fix)
        return {str(name) for graph in data["graphs"] for name in graph.get("entries", ())}
    except OSError as error:
        raise UsageError(f"--keep-run {path} cannot be read: {error.strerror}", fix=fix) from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UsageError(f"--keep-run {path} is not a key record", fix=fix) from None


def survey(
    cache: Path, keep_runs: Iterable[Path] = (), recent_days: float = 7.0,
    now: float | None = None,
) -> Survey:  # fmt: skip
    """What ``cache`` holds and which entries are kept, and why; reads only. The entries
    are listed before the install records are read: ``cache fetch`` writes a pack's
    record before it links the first entry, so every installed entry listed here has
    its record read below."""
    if not cache.is_dir():
        raise UsageError(f"{cache} is not a directory", fix="pass the cache directory (--cache)")
    found = Survey(cache)
    by_run = {str(p): _run_entries(p) for p in keep_runs}
    horizon = (time.time() if now is None else now) - recent_days * 86400
    listed: dict[str, os.stat_result] = {}
    present: set[str] = set()
    for child in sorted(cache.iterdir()):
        try:
            info = child.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode):
            present.add(child.name)
        if is_entry(child, info):
            listed[child.name] = info
        elif child.name != cache_pack.INSTALLED_DIR:
            found.others.append(child.name)
    records = cache_pack.read_installed(cache)
    found.unreadable = records.unreadable
    by_pack: dict[str, set[str]] = {}
    for path, manifest in records.manifests:
        label = f"{manifest.workload.get('name')}/{manifest.topology} ({path.stem[:12]})"
        by_pack[label] = {e.name for e in manifest.entries}
    for name, info in listed.items():
        found.sizes[name] = info.st_size
        found.mtimes[name] = info.st_mtime_ns
        why = next((f"named by installed pack {label}" for label, names in by_pack.items()
                    if name in names), None)  # fmt: skip
        why = why or next((f"named by run {run}" for run, names in by_run.items()
                           if name in names), None)  # fmt: skip
        if why is None and info.st_mtime >= horizon:
            why = f"written within {recent_days:g} day(s)"
        if why is None and found.unreadable:
            why = "kept while an install record cannot be read"
        if why is None:
            found.unreferenced.append(name)
        else:
            found.kept[name] = why
    found.packs = {label: len(names & present) for label, names in by_pack.items()}
    return found


def not_a_cache(found: Survey) -> UsageError:
    """``cache prune --apply`` of a directory that shows no sign of a persistent cache."""
    return UsageError(
        f"{found.cache} does not look like a torch_xla persistent cache: none of its "
        f"{len(found.others)} file(s) is a cache entry (named by a key's hash and ending "
        "with the entry footer XLAPCF01 of patch 0004) and no pack was installed there; "
        "nothing was removed",
        fix="pass the training job's cache directory (its XLA_PERSISTENT_CACHE_PATH) to "
        "--cache; `cache size --cache DIR` shows what a directory holds",
    )


@contextlib.contextmanager
def pruning(cache: Path) -> Iterator[None]:
    """Hold ``cache``'s install lock exclusively (module doc): its records' directory and
    lock are made where missing (hidden names, never entries)."""
    cache_pack.records_directory(cache)  # made where missing; never a link
    with cache_pack.install_lock(cache, exclusive=True):
        yield


def prune(found: Survey) -> list[str]:
    """Remove the unreferenced entries of ``found``; an entry that changed since it was
    surveyed (another size or time: a process wrote it again) is left alone. Run it under
    :func:`pruning`, with ``found`` surveyed under it too."""
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
