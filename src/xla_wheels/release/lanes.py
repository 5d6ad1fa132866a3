"""Lanes: ``build/lanes.toml`` (where bundles go, and what it takes) and ``lanes.lock``.

``build/lanes.toml`` (hand-written, reviewed)::

    publish-lane = "validation"          # where `make publish` goes

    [lanes.validation]
    description = "every published bundle"
    path = "dist/lanes/validation"       # a static PEP 503 index in this directory, or:
    # index-url = "https://pypi.corp/validation/simple/"   (upload-url = … if it differs)
    # or a devpi index (promotion is then devpi's own push, see release.devpi):
    # backend = "devpi"
    # server = "https://devpi.corp/"
    # index = "team/validation"

Each kind of lane (``backend``: ``static``, ``index``, ``devpi``) is a
:class:`~xla_wheels.release.lane_backend.LaneBackend` of the registry
``release.lane_kinds``, which reads the kind's own keys; a :class:`Lane` holds its backend
and everything that depends on the kind goes through it.

    [lanes.preferred]
    description = "what training hosts install"
    path = "dist/lanes/preferred"
    promote-from = "validation"          # promotion copies the files from this lane
    [lanes.preferred.policy]
    device = "TPU"                       # a CPU receipt never satisfies a TPU rule
    checks = ["restart", "hbm"]          # each must have passed in the receipt
    max-warm-regression = 0.10           # warm time-to-ready at most 10% slower than the
                                         # lane's current bundle's receipt (omit: no gate)
    max-memory-regression = 0.10         # peak memory (host, and each device that reports
                                         # it) at most 10% above that receipt's (omit: none)
    profile = "train"                    # the receipt was judged under this launch profile
                                         # of the bundle, with the digest wheels.lock has
    workload = "small"                   # the receipt's workload (a preset, or a user's
                                         # "<file>.py:<factory>" / "<module>:<factory>")
    require-signed-receipts = true       # only a receipt signed with one of these keys
    receipt-keys = ["keys/gate.pub"]     # (PEM public keys, relative to the checkout)
    topologies = ["v6e-8", "v6e-32"]     # a passing receipt from each of these slices
                                         # (receipts of other topologies never compare)

A lane may name where its receipts are kept, ``receipts = "<directory>" |
"https://host/path/" | "gs://bucket/prefix"`` (``xla_host.receipt_store``): the gate
uploads its receipt there, and promote, compare and status read every lane's store as
well as ``receipts/<bundle>/``.

A lane of any kind may name where its cache packs are kept, ``packs = "gs://bucket/prefix"
| "<directory>"`` (``release.pack_store``; a static lane keeps them in its directory
otherwise, an index or devpi lane keeps none).

A lane may add ``require-signature = true`` and ``signing-public-key = "<PEM, relative to
the checkout>"``: publish and promote then refuse a wheel whose signed attestation that
key does not verify (``attestation``).

``lanes.lock`` (written by ``publish``/``promote``/``rollback``, by rename, only after
success) records each lane's current bundle, its wheels and the receipt that let it in, and
beside it the history those states come from: every publish, promotion and rollback as a
``[[history]]`` entry, newest last, with who, when, from which bundle, to which, why, and
the receipt's digest. Each entry carries the sha256 of the entry before it and
``history-head`` the last one's, so a hand edit breaks the chain and reading the record
refuses it, naming the line. A version 1 record (no history) is read as it is and gets a
``recorded`` entry per lane the first time it is written again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import getpass
import hashlib
import json
import os
import re
import socket
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xla_host import filemode, log, receipt_store
from xla_host.errors import ExitCode, UsageError
from xla_host.tables import Field, Table, loads_toml, read_utf8
from xla_host.values import NAME_PATTERN, NAME_RULE
from xla_host.waitlock import waiting_lock
from xla_wheels.release import pack_store
from xla_wheels.release.lane_backend import LaneBackend, LaneError
from xla_wheels.release.lane_kinds import KINDS, kind_of

LANES_CONFIG = Path("build") / "lanes.toml"
LANES_LOCK = "lanes.lock"
LANES_LOCK_VERSION = "2"
#: Versions :func:`read_record` reads: 1 had the current states only (no history).
READABLE_VERSIONS = ("1", LANES_LOCK_VERSION)
#: What a history entry did: ``recorded`` stands for a state migrated from version 1.
ACTIONS = ("publish", "promote", "rollback", "recorded")
DEVICES = ("CPU", "TPU")
#: ``backend`` values: the registered kinds of lane (``release.lane_kinds``).
BACKENDS = tuple(KINDS)


class LaneFileError(LaneError):
    """``build/lanes.toml`` or ``lanes.lock`` itself is bad input (missing, not TOML, a
    wrong key, type or value): exit 2, like a malformed manifest."""

    exit_code = ExitCode.BAD_INPUT


@dataclass(frozen=True)
class Policy:
    device: str | None = None
    checks: tuple[str, ...] = ()
    max_warm_regression: float | None = None
    max_memory_regression: float | None = None
    profile: str | None = None
    """The launch profile (``make gate PROFILE=``) a receipt must have been judged under."""
    workload: str | None = None
    """The workload (``make gate WORKLOAD=``, by its receipt name) a receipt must have run."""
    receipt_keys: tuple[Path, ...] = ()
    """``require-signed-receipts = true`` + ``receipt-keys``: a receipt counts only when it
    is signed (a DSSE envelope) with one of these public keys (absolute PEM paths)."""
    topologies: tuple[str, ...] = ()
    """Slice topologies (``v6e-8``, ``v6e-32``) each of which needs a passing receipt."""
    packs: tuple[tuple[str, str], ...] = ()
    """``require-packs = ["small:v6e-8"]``: (workload, topology) pairs each of which needs a
    cache pack of the bundle in the lane it is promoted from (``release.lane_packs``)."""

    @property
    def empty(self) -> bool:
        return self == Policy()


#: ``pack-receipts``: what proves a cache pack before ``make cache-pack`` publishes it.
PACK_RECEIPTS = {
    "locked-wheels": "a gate receipt that passed for the bundle's locked wheels (the default)",
    "any-wheels": "a gate receipt whose checks passed on any wheels: a CPU or demo lane, whose "
    "gate runs stock torch_xla, not the bundle's wheels; hosts still fetch a pack only for "
    "their own torch_xla, device and topology",
}


@dataclass(frozen=True)
class Lane:
    name: str
    backend: LaneBackend
    """Where the lane is and how it is reached: every kind-dependent step goes through it."""
    promote_from: str | None = None
    policy: Policy = field(default_factory=Policy)
    signing_public_key: Path | None = None
    """``require-signature = true`` + ``signing-public-key``: publish and promote refuse
    a wheel without a signature this key verifies (``attestation``)."""
    receipts: str | None = None
    """Where the lane's receipts are kept (``receipts = …``): an absolute directory, an
    http(s) WebDAV URL or a gs:// URL (``xla_host.receipt_store``)."""
    pack_receipts: str = "locked-wheels"
    """What receipt ``make cache-pack`` accepts as a pack's proof (``pack-receipts``): one
    that passed for the bundle's locked wheels (:data:`PACK_RECEIPTS`)."""

    @property
    def kind(self) -> str:
        return self.backend.kind

    @property
    def where(self) -> str:
        """The lane as every display shows it (``lanes``, ``status``, logs, errors): an
        index URL's credentials (``user:pw@``, ``?token=``) masked, control characters
        escaped. Never for reaching the lane: that is :attr:`simple_url`."""
        return self.backend.where

    @property
    def simple_url(self) -> str:
        return self.backend.simple_url


@dataclass(frozen=True)
class LanesConfig:
    path: Path
    publish_lane: str
    lanes: Mapping[str, Lane]

    @property
    def receipt_stores(self) -> tuple[str, ...]:
        """Every lane's receipt store, once each: where a bundle's receipts are read from
        (besides ``receipts/<bundle>/``)."""
        return tuple(sorted({lane.receipts for lane in self.lanes.values() if lane.receipts}))

    def lane(self, name: str) -> Lane:
        if name not in self.lanes:
            raise UsageError(
                f"{self.path} has no lane {name!r}",
                fix=f"use one of: {', '.join(sorted(self.lanes))}",
            )
        return self.lanes[name]


@dataclass(frozen=True)
class LaneState:
    bundle: str
    wheels: tuple[tuple[str, str], ...]
    """(file name, sha256) of every file the lane received."""
    receipt: str | None
    receipt_digest: str | None


def _format_fix(path: Path) -> str:
    return f'edit {path} (format: its header comment and docs/lanes.md "Releasing to the fleet")'


def _policy(root: Path, table: Table) -> Policy:
    fields = table.read(
        Field("device", str),
        Field("checks", list, default=[], items=str),
        Field("max-warm-regression", (int, float)),
        Field("max-memory-regression", (int, float)),
        Field("profile", str),
        Field("workload", str),
        Field("require-signed-receipts", bool, default=False),
        Field("receipt-keys", list, default=[], items=str),
        Field("topologies", list, default=[], items=str),
        Field("require-packs", list, default=[], items=str),
    )
    if fields["require-signed-receipts"] != bool(fields["receipt-keys"]):
        raise table.fail(
            "require-signed-receipts",
            "require-signed-receipts = true needs receipt-keys (the public keys, PEM files "
            "relative to the checkout, whose signatures the lane accepts), and the keys are "
            "read only when signed receipts are required",
            "",
        )
    keys = tuple((root / key).resolve() for key in fields["receipt-keys"])
    device = fields["device"]
    if device is not None and device not in DEVICES:
        raise table.fail("device", f"{device!r} is not one of {DEVICES}", "")
    tolerances = ("max-warm-regression", "max-memory-regression")
    for key in tolerances:
        if fields[key] is not None and fields[key] < 0:
            raise table.fail(key, "must be a number >= 0", "")
    if fields["profile"] == "":
        raise table.fail("profile", "must be a launch profile name", "")
    if fields["workload"] is not None:
        fields["workload"] = _workload(table, "workload", fields["workload"])
    warm, memory = (None if fields[key] is None else float(fields[key]) for key in tolerances)
    return Policy(
        device,
        tuple(fields["checks"]),
        warm,
        memory,
        fields["profile"],
        fields["workload"],
        keys,
        topologies=_topologies(table, fields["topologies"]),
        packs=_packs(table, fields["require-packs"]),
    )


def _packs(table: Table, values: list[str]) -> tuple[tuple[str, str], ...]:
    """``require-packs = ["small:v6e-8"]``: workload (as receipts name it) and topology."""
    pairs = []
    for value in values:
        workload, _, topology = value.rpartition(":")
        if not workload or not re.fullmatch(r"[a-z0-9]+-[0-9]+(x[0-9]+)?", topology):
            raise table.fail(
                "require-packs", f"{value!r} is not <workload>:<topology> like small:v6e-8", ""
            )
        pairs.append((_workload(table, "require-packs", workload), topology))
    return tuple(pairs)


def _workload(table: Table, key: str, text: str) -> str:
    """A workload as receipts and packs name it, from any spelling the gate takes
    (``/path/decoder.py:build`` is ``decoder.py:build``: xla_host.gate.workload)."""
    from xla_host.gate.workload import name_of
    from xla_host.values import BadValue

    try:
        return name_of(text).name
    except BadValue as bad:
        raise table.fail(key, f"{text!r} {bad.reason}", "") from None


def _topologies(table: Table, values: list[str]) -> tuple[str, ...]:
    """``topologies = ["v6e-8", "v6e-32"]``: as receipts record them (xla_host.gate.slice)."""
    for value in values:
        if not re.fullmatch(r"[a-z0-9]+-[0-9]+(x[0-9]+)?", value):
            raise table.fail(
                "topologies", f"{value!r} is not a slice topology like v6e-8 or cpu-2x1", ""
            )
    if len(set(values)) != len(values):
        raise table.fail("topologies", "names a topology twice", "")
    return tuple(values)


def _signing_key(root: Path, table: Table, fields: Mapping[str, Any]) -> Path | None:
    required, key = fields["require-signature"], fields["signing-public-key"]
    if required != (key is not None):
        raise table.fail(
            "require-signature",
            "require-signature = true needs signing-public-key (the team's public key, a PEM "
            "file relative to the checkout), and the key is read only when it is required",
            "",
        )
    return (root / key).resolve() if required else None


def _lane(root: Path, name: str, table: Table, names: Mapping[str, Any]) -> Lane:
    """One ``[lanes.<name>]``: the keys of its kind (``release.lane_kinds``) and the keys
    every lane has."""
    kind_name = kind_of(table.data)
    if kind_name is None:
        raise table.fail("path", "give exactly one of path or index-url", "")
    kind = KINDS.get(kind_name)
    if kind is None:
        raise table.fail("backend", f"{kind_name!r} is not one of {tuple(KINDS)}", "")
    signing = (Field("require-signature", bool, default=False), Field("signing-public-key", str))
    fields = table.read(
        Field("description", str),  # for the reader of lanes.toml
        Field("backend", str, default="index"),
        *kind.keys,
        Field("promote-from", str),
        Field("policy", dict, default={}),
        Field("receipts", str),
        Field("packs", str),
        Field("pack-receipts", str, default="locked-wheels"),
        *(signing if kind.signatures else ()),
    )
    if fields["pack-receipts"] not in PACK_RECEIPTS:
        choices = " or ".join(f'"{k}"' for k in PACK_RECEIPTS)
        raise table.fail("pack-receipts", f"{fields['pack-receipts']!r} is not {choices}", "")
    receipts = None
    if fields["receipts"] is not None:
        try:
            receipts = receipt_store.parse_location(fields["receipts"], root)
        except UsageError as error:
            raise table.fail("receipts", error.message, error.fix or "") from None
    backend = kind.make(name, table, fields, root)
    if fields["packs"] is not None:
        try:
            store = pack_store.store_for(fields["packs"], name, root)
        except UsageError as error:
            raise table.fail("packs", error.message, error.fix or "") from None
        backend = dataclasses.replace(backend, pack_store=store)  # type: ignore[type-var]
    lane = Lane(
        name=name,
        backend=backend,
        promote_from=fields["promote-from"],
        policy=_policy(root, table.table("policy", optional=True)),
        signing_public_key=_signing_key(root, table, fields) if kind.signatures else None,
        receipts=receipts,
        pack_receipts=fields["pack-receipts"],
    )
    if lane.promote_from is not None and lane.promote_from not in names:
        raise table.fail("promote-from", f"no lane {lane.promote_from!r}", "")
    return lane


def load_config(root: Path) -> LanesConfig:
    path = root / LANES_CONFIG
    try:
        text = read_utf8(path, LaneFileError, what="lanes file")[0]
        data = loads_toml(text, source=str(path), error=LaneFileError)
    except FileNotFoundError:
        raise LaneFileError(
            f"{path} does not exist",
            fix='create it (docs/lanes.md "Releasing to the fleet" shows one)',
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise LaneFileError(f"{path}: not valid TOML: {error}", fix=_format_fix(path)) from error
    top = Table(data, source=str(path), error=LaneFileError, fix=_format_fix(path))
    publish_lane = top.read(
        Field("publish-lane", str, default="validation"), Field("lanes", dict, default={})
    )["publish-lane"]
    lanes: dict[str, Lane] = {}
    for name, table in top.tables("lanes").items():
        # A lane name is typed as LANE= and offered in "use one of": a valid name only.
        if NAME_PATTERN.fullmatch(name) is None:
            raise top.fail(f"lanes.{name}", f"{name!r} is not a valid lane name ({NAME_RULE})", "")
        lanes[name] = _lane(root, name, table, data["lanes"])
    if not lanes:
        raise top.fail("lanes", "no lane is defined", "")
    if publish_lane not in lanes:
        raise top.fail("publish-lane", f"no lane {publish_lane!r}", "")
    return LanesConfig(path, publish_lane, lanes)


@dataclass(frozen=True)
class HistoryEntry:
    """One change of one lane: who moved it from which bundle to which, when and why."""

    lane: str
    action: str
    bundle: str
    previous_bundle: str | None
    who: str
    when: str
    """UTC, ISO 8601 to the second."""
    reason: str
    wheels: tuple[tuple[str, str], ...]
    receipt: str | None
    receipt_digest: str | None
    previous: str
    """sha256 of the entry before (``""`` for the first): the chain a hand edit breaks."""

    @property
    def state(self) -> LaneState:
        return LaneState(self.bundle, self.wheels, self.receipt, self.receipt_digest)

    def as_toml(self) -> dict[str, Any]:
        table: dict[str, Any] = {
            "lane": self.lane,
            "action": self.action,
            "bundle": self.bundle,
            "from": self.previous_bundle or "",
            "who": self.who,
            "when": self.when,
            "reason": self.reason,
            "receipt": self.receipt or "",
            "receipt-digest": self.receipt_digest or "",
            "previous": self.previous,
            "wheels": [{"name": n, "sha256": s} for n, s in self.wheels],
        }
        return table

    @property
    def digest(self) -> str:
        # Canonical JSON of exactly what is written: tomllib reads back the same values.
        text = json.dumps(self.as_toml(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class LanesRecord:
    """``lanes.lock``: each lane's current state and the history it comes from."""

    states: Mapping[str, LaneState]
    history: tuple[HistoryEntry, ...]

    def lane_history(self, lane: str) -> list[HistoryEntry]:
        return [entry for entry in self.history if entry.lane == lane]

    @property
    def head(self) -> str:
        """The last history entry's digest (empty: no history yet)."""
        return self.history[-1].digest if self.history else ""


#: The lock file in a lane directory whose filesystem refuses a lock on a directory.
LANE_LOCK_FILE = ".xla-wheels-lane.lock"


@contextlib.contextmanager
def _locked_directory(directory: Path, doing: str) -> Iterator[int | None]:
    """An exclusive ``flock`` on ``directory`` itself for the block: nothing is written
    into it (a lane is served as it is). A filesystem that refuses a lock on a directory
    (NFS emulates ``flock`` with POSIX locks, which need a file open for writing) gets a
    lock file in it instead. A waiter is told what it waits for, then waits. Yields the
    locked directory's descriptor (None with a lock file)."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            _flock(descriptor, doing)
        except OSError as error:
            if error.errno not in (errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            with waiting_lock(directory / LANE_LOCK_FILE, doing):
                yield None
            return
        yield descriptor
    finally:
        os.close(descriptor)  # releases the lock


@contextlib.contextmanager
def _locked_lane(directory: Path, doing: str) -> Iterator[None]:
    """The lane's directory, locked; made when missing. A run that made it and wrote
    nothing into it (a refused promotion) removes it again, under its lock, so a refusal
    leaves no empty lane behind; a waiter that then finds the directory it locked gone
    (or replaced) from its path locks the one there now."""
    while True:
        created = False
        try:
            directory.mkdir(parents=True)
            created = True
        except FileExistsError:
            pass
        with _locked_directory(directory, doing) as descriptor:
            if descriptor is not None and not _still_at(directory, descriptor):
                continue
            try:
                yield
            finally:
                if created:
                    with contextlib.suppress(OSError):  # not empty: the run wrote its lane
                        directory.rmdir()
            return


def _still_at(directory: Path, descriptor: int) -> bool:
    try:
        here, locked = os.stat(directory), os.fstat(descriptor)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (locked.st_dev, locked.st_ino)


def _flock(descriptor: int, doing: str) -> None:
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info(f"waiting for another process {doing} ...")
        fcntl.flock(descriptor, fcntl.LOCK_EX)


@contextlib.contextmanager
def lane_lock(root: Path, lane: Lane) -> Iterator[str]:
    """Hold ``lane`` for one read-modify-write: its directory (a static lane: its files
    and its index, shared by every checkout that publishes there) and this checkout's
    ``lanes.lock`` (the checkout's directory), always in that order. Yields lanes.lock's
    history head as read under the lock: :func:`write_state` refuses to record over any
    other (a writer that did not take the lock), instead of losing its entry."""
    with contextlib.ExitStack() as held:
        if (directory := lane.backend.directory) is not None:
            held.enter_context(_locked_lane(directory, f"writing lane {lane.name}"))
        held.enter_context(_locked_directory(root, f"writing {LANES_LOCK}"))
        yield read_record(root).head


def _restore_fix() -> str:
    return (
        f"restore it from git (`git checkout -- {LANES_LOCK}`, or `git log -p {LANES_LOCK}` "
        "for an older good one); lanes.lock is written only by publish, promote and rollback"
    )


def _header_lines(text: str, pattern: str) -> list[int]:
    """1-based line numbers of the lines matching ``pattern`` (a TOML table header)."""
    header = re.compile(pattern)
    return [n for n, line in enumerate(text.splitlines(), 1) if header.fullmatch(line.strip())]


def _lane_line(text: str, lane: str) -> int | None:
    found = _header_lines(text, rf"\[lanes\.\"?{re.escape(lane)}\"?\]")
    return found[0] if found else None


def read_record(root: Path) -> LanesRecord:
    """``lanes.lock`` with its history, checked: the chain of entry digests holds and each
    lane's current state is its last entry's (raises :class:`LaneFileError` naming the line)."""
    path = root / LANES_LOCK
    if not path.exists():
        return LanesRecord({}, ())
    text, top, fields = _read_lock_file(path)
    states = _read_states(top)
    if fields["lanes-lock-version"] == "1":
        return LanesRecord(states, ())  # before history: the states are all there is
    lines = _header_lines(text, r"\[\[history\]\]")
    history: list[HistoryEntry] = []
    for number, row in enumerate(top.rows("history") or []):
        entry = _read_entry(row)
        _check_link(path, lines, history, number, entry)
        history.append(entry)
    _check_head(path, lines, history, fields["history-head"] or "")
    _check_states(path, text, states, history)
    return LanesRecord(states, tuple(history))


def _read_lock_file(path: Path) -> tuple[str, Table, dict[str, Any]]:
    """``lanes.lock``'s text, its top table and top-level keys, of a readable version."""
    restore = _restore_fix()
    text = read_utf8(path, LaneFileError, what="lanes lock")[0]
    try:
        data = loads_toml(text, source=str(path), error=LaneFileError, fix=restore)
    except tomllib.TOMLDecodeError as error:
        raise LaneFileError(f"{path} is not valid TOML: {error}", fix=restore) from error
    if data.get("lanes-lock-version") not in READABLE_VERSIONS:
        raise LaneFileError(f"{path} has an unknown lanes-lock-version", fix=restore)
    top = Table(data, source=str(path), error=LaneFileError, fix=restore)
    fields = top.read(
        Field("lanes-lock-version", str),
        Field("lanes", dict, default={}),
        Field("history-head", str),
        Field("history", list, default=[]),
    )
    return text, top, fields


def _wheels_of(table: Table) -> tuple[tuple[str, str], ...]:
    """A state's or an entry's ``wheels = [{name, sha256}, …]``."""
    fields = (Field("name", str, required=True), Field("sha256", str, required=True))
    rows = [row.read(*fields) for row in table.rows("wheels") or []]
    return tuple((row["name"], row["sha256"]) for row in rows)


def _read_states(top: Table) -> dict[str, LaneState]:
    """``[lanes.<name>]``: each lane's current state as written."""
    states = {}
    for name, table in top.tables("lanes").items():
        lane = table.read(
            Field("bundle", str, required=True),
            Field("receipt", str),
            Field("receipt-digest", str),
            Field("wheels", list, default=[]),
        )
        states[name] = LaneState(
            bundle=lane["bundle"],
            wheels=_wheels_of(table),
            receipt=lane["receipt"],
            receipt_digest=lane["receipt-digest"],
        )
    return states


def _read_entry(row: Table) -> HistoryEntry:
    """One ``[[history]]`` table as it is written (checked against the chain after)."""
    item = row.read(
        Field("lane", str, required=True),
        Field("action", str, required=True),
        Field("bundle", str, required=True),
        Field("from", str, default=""),
        Field("who", str, required=True),
        Field("when", str, required=True),
        Field("reason", str, default=""),
        Field("receipt", str, default=""),
        Field("receipt-digest", str, default=""),
        Field("previous", str, required=True),
        Field("wheels", list, default=[]),
    )
    return HistoryEntry(
        lane=item["lane"],
        action=item["action"],
        bundle=item["bundle"],
        previous_bundle=item["from"] or None,
        who=item["who"],
        when=item["when"],
        reason=item["reason"],
        wheels=_wheels_of(row),
        receipt=item["receipt"] or None,
        receipt_digest=item["receipt-digest"] or None,
        previous=item["previous"],
    )


def _check_link(
    path: Path, lines: Sequence[int], history: Sequence[HistoryEntry], number: int,
    entry: HistoryEntry,
) -> None:  # fmt: skip
    """Entry ``number`` (0-based) is an action this program writes and its ``previous`` is
    the digest of the entry before it as written: an edit of that entry (or of this
    ``previous``) breaks the chain here. ``lines``: each entry's header line."""
    expected = history[-1].digest if history else ""
    if entry.action in ACTIONS and entry.previous == expected:
        return
    line = lines[number] if number < len(lines) else 0
    what = (
        f"history entry {number} (line {lines[number - 1]}) was changed after it was "
        f"written: entry {number + 1} (line {line}) records another digest for it"
        if history and entry.action in ACTIONS
        else f"history entry {number + 1} ({entry.action}) is not one this program writes"
        if entry.action not in ACTIONS
        else f"history entry 1 (line {line}) has a chain digest, the first has none"
    )
    raise LaneFileError(
        f"{path} line {lines[number - 1] if history else line}: {what} (the record "
        "was edited by hand or is corrupted)",
        fix=_restore_fix(),
    )


def _check_head(
    path: Path, lines: Sequence[int], history: Sequence[HistoryEntry], head: str
) -> None:
    """``history-head`` is the last entry's digest: an edit of the last entry shows here."""
    if history and head != history[-1].digest:
        raise LaneFileError(
            f"{path} line {lines[len(history) - 1]}: history entry {len(history)} (the last) "
            "was changed after it was written: history-head records another digest for it "
            "(the record was edited by hand or is corrupted)",
            fix=_restore_fix(),
        )


def _check_states(
    path: Path, text: str, states: Mapping[str, LaneState], history: Sequence[HistoryEntry]
) -> None:
    """Each lane's current state is the one its last history entry records."""
    derived = {entry.lane: entry.state for entry in history}
    for name in sorted(set(states) | set(derived)):
        if states.get(name) != derived.get(name):
            where = _lane_line(text, name)
            raise LaneFileError(
                f"{path}" + (f" line {where}" if where else "") + f": lane {name}'s current "
                "state is not the one its last history entry records (edited by hand)",
                fix=_restore_fix(),
            )


def read_state(root: Path) -> dict[str, LaneState]:
    return dict(read_record(root).states)


def operator() -> str:
    """Who changes a lane, for its history: the login on this host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _migrated(record: LanesRecord, when: str) -> list[HistoryEntry]:
    """A version 1 record's states as the first history entries (``recorded``)."""
    entries: list[HistoryEntry] = []
    for name in sorted(record.states):
        if record.lane_history(name):
            continue
        state = record.states[name]
        entries.append(
            HistoryEntry(
                name,
                "recorded",
                state.bundle,
                None,
                "lanes.lock version 1",
                when,
                "state found in a lanes.lock without history",
                state.wheels,
                state.receipt,
                state.receipt_digest,
                "",
            )  # fmt: skip
        )
    return entries


def _chained(entries: Sequence[HistoryEntry]) -> list[HistoryEntry]:
    chained: list[HistoryEntry] = []
    for entry in entries:
        previous = chained[-1].digest if chained else ""
        chained.append(HistoryEntry(**{**entry.__dict__, "previous": previous}))
    return chained


def write_state(
    root: Path,
    lane: str,
    state: LaneState,
    *,
    action: str = "publish",
    reason: str = "",
    expected_head: str | None = None,
) -> Path:
    """Record ``lane``'s new current bundle as a history entry of ``action`` (who, when,
    from which bundle); temp file + rename, so a crash changes nothing. Run it under
    :func:`lane_lock` and pass the head it yielded as ``expected_head``: a record whose
    head moved since is refused, never written over (that lost an entry)."""
    path, text, _ = recorded(
        root, lane, state, action=action, reason=reason, expected_head=expected_head
    )
    filemode.write_by_rename(path, text)
    return path


def recorded(
    root: Path,
    lane: str,
    state: LaneState,
    *,
    action: str = "publish",
    reason: str = "",
    expected_head: str | None = None,
) -> tuple[Path, str, LanesRecord]:
    """:func:`write_state` up to the write: where lanes.lock is, its new text and the
    record that text holds, for an update that renames it into place together with the
    lane's other files (``release.lane_state``: lanes.lock last)."""
    assert action in ACTIONS
    record = read_record(root)
    if expected_head is not None and record.head != expected_head:
        raise LaneError(
            f"{LANES_LOCK} changed while this {action} into lane {lane} ran: another "
            "publish, promotion or rollback recorded an entry after this one read it, and "
            "recording now would lose that entry (nothing was recorded)",
            fix=f"see what was recorded (`make lanes HISTORY=1`), then run this {action} "
            "again: its files are in the lane already, so it only records",
        )
    when = _now()
    old = record.states.get(lane)
    entry = HistoryEntry(
        lane, action, state.bundle, old.bundle if old else None, operator(), when, reason,
        state.wheels, state.receipt, state.receipt_digest, "",
    )  # fmt: skip
    history = _chained([*record.history, *_migrated(record, when), entry])
    current = {**record.states, lane: state}
    lanes: dict[str, Any] = {}
    for name in sorted(current):
        now = current[name]
        table: dict[str, Any] = {"bundle": now.bundle}
        if now.receipt:
            table["receipt"] = now.receipt
            table["receipt-digest"] = now.receipt_digest or ""
        table["wheels"] = [{"name": n, "sha256": s} for n, s in now.wheels]
        lanes[name] = table
    import tomli_w  # lazy: reading needs only tomllib, the gate's receipt too

    text = (
        "# lanes.lock: the current bundle of each lane and its history (newest last),\n"
        "# written by `make publish`, `make promote` and `make rollback` after they succeed.\n"
        "# Do not edit: each entry carries the previous one's sha256 and a hand edit is\n"
        '# refused. Format: docs/lanes.md, "Releasing to the fleet".\n\n'
        + tomli_w.dumps(
            {
                "lanes-lock-version": LANES_LOCK_VERSION,
                "history-head": history[-1].digest,
                "lanes": lanes,
                "history": [e.as_toml() for e in history],
            }
        )
    )
    return root / LANES_LOCK, text, LanesRecord(current, tuple(history))
