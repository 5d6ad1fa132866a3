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

A lane may add ``require-signature = true`` and ``signing-public-key = "<PEM, relative to
the checkout>"``: publish and promote then refuse a wheel whose signed attestation that
key does not verify (``attestation``).

``lanes.lock`` (written by ``publish``/``promote``, by rename, only after success) records
each lane's current bundle, its wheels and the receipt that let it in.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_wheels import filemode
from xla_wheels.errors import PipelineError, UsageError
from xla_wheels.tables import Field, Table, loads_toml, read_utf8

LANES_CONFIG = Path("build") / "lanes.toml"
LANES_LOCK = "lanes.lock"
LANES_LOCK_VERSION = "1"
DEVICES = ("CPU", "TPU")
#: ``backend`` values: ``index`` (a static directory or any PEP 503 index; the default)
#: and ``devpi`` (an index of a devpi server: uploads to it, promotion by devpi's push).
BACKENDS = ("index", "devpi")


class LaneError(PipelineError):
    """A lane refuses a bundle (its policy, a missing receipt): exit 1."""


class LaneFileError(LaneError):
    """``build/lanes.toml`` or ``lanes.lock`` itself is bad input (missing, not TOML, a
    wrong key, type or value): exit 2, like a malformed manifest."""

    exit_code = 2


@dataclass(frozen=True)
class Policy:
    device: str | None = None
    checks: tuple[str, ...] = ()
    max_warm_regression: float | None = None
    max_memory_regression: float | None = None
    profile: str | None = None
    """The launch profile (``make gate PROFILE=``) a receipt must have been judged under."""

    @property
    def empty(self) -> bool:
        return self == Policy()


@dataclass(frozen=True)
class Lane:
    name: str
    path: Path | None
    """A static index directory (absolute), or None for a remote index."""
    index_url: str | None
    upload_url: str | None
    promote_from: str | None
    policy: Policy
    backend: str = "index"
    devpi_index: str | None = None
    """``user/index`` on the devpi server, for a ``devpi`` lane (index_url is its simple page)."""
    signing_public_key: Path | None = None
    """``require-signature = true`` + ``signing-public-key``: publish and promote refuse
    a wheel without a signature this key verifies (``attestation``)."""

    @property
    def where(self) -> str:
        return self.index_url or str(self.path)

    @property
    def simple_url(self) -> str:
        if self.index_url:
            return self.index_url
        assert self.path is not None
        return (self.path / "simple").resolve().as_uri() + "/"


@dataclass(frozen=True)
class LanesConfig:
    path: Path
    publish_lane: str
    lanes: Mapping[str, Lane]

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
    return f'edit {path} (format: its header comment and README "Releasing to the fleet")'


def _policy(table: Table) -> Policy:
    fields = table.read(
        Field("device", str),
        Field("checks", list, default=[], items=str),
        Field("max-warm-regression", (int, float)),
        Field("max-memory-regression", (int, float)),
        Field("profile", str),
    )
    device = fields["device"]
    if device is not None and device not in DEVICES:
        raise table.fail("device", f"{device!r} is not one of {DEVICES}", "")
    tolerances = ("max-warm-regression", "max-memory-regression")
    for key in tolerances:
        if fields[key] is not None and fields[key] < 0:
            raise table.fail(key, "must be a number >= 0", "")
    if fields["profile"] == "":
        raise table.fail("profile", "must be a launch profile name", "")
    warm, memory = (None if fields[key] is None else float(fields[key]) for key in tolerances)
    return Policy(device, tuple(fields["checks"]), warm, memory, fields["profile"])


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
    """One ``[lanes.<name>]``: a static directory or remote index, or one index
    (``user/index``) of a devpi server, each with its own keys."""
    devpi = table.data.get("backend", "index") == "devpi"
    where = [Field("server", str, required=True), Field("index", str, required=True)]
    if not devpi:
        where = [Field("path", str), Field("index-url", str), Field("upload-url", str)]
    signing = (Field("require-signature", bool, default=False), Field("signing-public-key", str))
    fields = table.read(
        Field("description", str),  # for the reader of lanes.toml
        Field("backend", str, default="index"),
        *where,
        Field("promote-from", str),
        Field("policy", dict, default={}),
        *(() if devpi else signing),
    )
    devpi_index = path = None
    if devpi:
        server = fields["server"]
        if not server.startswith(("http://", "https://")):
            raise table.fail("server", "must be the devpi server's http(s) URL", "")
        devpi_index = fields["index"].strip("/")
        if len(devpi_index.split("/")) != 2:
            raise table.fail("index", 'must be "<user>/<index>", e.g. "team/validation"', "")
        # devpi's own layout: the simple page under +simple/, uploads to the index URL.
        upload_url = f"{server.rstrip('/')}/{devpi_index}/"
        index_url = f"{upload_url}+simple/"
    else:
        if fields["backend"] not in BACKENDS:
            raise table.fail("backend", f"{fields['backend']!r} is not one of {BACKENDS}", "")
        if (fields["path"] is None) == (fields["index-url"] is None):
            raise table.fail("path", "give exactly one of path or index-url", "")
        index_url, upload_url = fields["index-url"], fields["upload-url"]
        if index_url and not index_url.endswith("/"):
            index_url = f"{index_url}/"
        if fields["path"] is not None:
            path = (root / fields["path"]).resolve()
    lane = Lane(
        name=name,
        path=path,
        index_url=index_url,
        upload_url=upload_url,
        promote_from=fields["promote-from"],
        policy=_policy(table.table("policy", optional=True)),
        backend=fields["backend"],
        devpi_index=devpi_index,
        signing_public_key=None if devpi else _signing_key(root, table, fields),
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
            f"{path} does not exist", fix='create it (README "Releasing to the fleet" shows one)'
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise LaneFileError(f"{path}: not valid TOML: {error}", fix=_format_fix(path)) from error
    top = Table(data, source=str(path), error=LaneFileError, fix=_format_fix(path))
    publish_lane = top.read(
        Field("publish-lane", str, default="validation"), Field("lanes", dict, default={})
    )["publish-lane"]
    lanes: dict[str, Lane] = {}
    for name, table in top.tables("lanes").items():
        lanes[name] = _lane(root, name, table, data["lanes"])
    if not lanes:
        raise top.fail("lanes", "no lane is defined", "")
    if publish_lane not in lanes:
        raise top.fail("publish-lane", f"no lane {publish_lane!r}", "")
    return LanesConfig(path, publish_lane, lanes)


def read_state(root: Path) -> dict[str, LaneState]:
    path = root / LANES_LOCK
    if not path.exists():
        return {}
    restore = f"restore it from git (`git checkout -- {LANES_LOCK}`)"
    try:
        text = read_utf8(path, LaneFileError, what="lanes lock")[0]
        data = loads_toml(text, source=str(path), error=LaneFileError, fix=restore)
    except tomllib.TOMLDecodeError as error:
        raise LaneFileError(f"{path} is not valid TOML: {error}", fix=restore) from error
    if data.get("lanes-lock-version") != LANES_LOCK_VERSION:
        raise LaneFileError(f"{path} has an unknown lanes-lock-version", fix=restore)
    top = Table(data, source=str(path), error=LaneFileError, fix=restore)
    top.read(Field("lanes-lock-version", str), Field("lanes", dict, default={}))
    wheel_fields = (Field("name", str, required=True), Field("sha256", str, required=True))
    states = {}
    for name, table in top.tables("lanes").items():
        fields = table.read(
            Field("bundle", str, required=True),
            Field("receipt", str),
            Field("receipt-digest", str),
            Field("wheels", list, default=[]),
        )
        wheels = [row.read(*wheel_fields) for row in table.rows("wheels") or []]
        states[name] = LaneState(
            bundle=fields["bundle"],
            wheels=tuple((wheel["name"], wheel["sha256"]) for wheel in wheels),
            receipt=fields["receipt"],
            receipt_digest=fields["receipt-digest"],
        )
    return states


def write_state(root: Path, lane: str, state: LaneState) -> Path:
    """Record ``lane``'s current bundle; temp file + rename, so a crash changes nothing."""
    current = read_state(root)
    current[lane] = state
    lanes: dict[str, Any] = {}
    for name in sorted(current):
        entry = current[name]
        table: dict[str, Any] = {"bundle": entry.bundle}
        if entry.receipt:
            table["receipt"] = entry.receipt
            table["receipt-digest"] = entry.receipt_digest or ""
        table["wheels"] = [{"name": n, "sha256": s} for n, s in entry.wheels]
        lanes[name] = table
    import tomli_w  # lazy: reading needs only tomllib, the gate's receipt too

    text = (
        "# lanes.lock: the current bundle of each lane, written by `make publish` and\n"
        "# `make promote` after they succeed. Do not edit; format: README.md.\n\n"
        + tomli_w.dumps({"lanes-lock-version": LANES_LOCK_VERSION, "lanes": lanes})
    )
    path = root / LANES_LOCK
    filemode.write_by_rename(path, text)
    return path
