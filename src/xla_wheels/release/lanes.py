"""Lanes: ``build/lanes.toml`` (where bundles go, and what it takes) and ``lanes.lock``.

``build/lanes.toml`` (hand-written, reviewed)::

    publish-lane = "validation"          # where `make publish` goes

    [lanes.validation]
    description = "every published bundle"
    path = "dist/lanes/validation"       # a static PEP 503 index in this directory, or:
    # index-url = "https://pypi.corp/validation/simple/"   (upload-url = … if it differs)

    [lanes.preferred]
    description = "what training hosts install"
    path = "dist/lanes/preferred"
    promote-from = "validation"          # promotion copies the files from this lane
    [lanes.preferred.policy]
    device = "TPU"                       # a CPU receipt never satisfies a TPU rule
    checks = ["restart", "hbm"]          # each must have passed in the receipt
    max-warm-regression = 0.10           # warm time-to-ready at most 10% slower than the
                                         # lane's current bundle's receipt (omit: no gate)

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
from xla_wheels.tables import Field, Table

LANES_CONFIG = Path("build") / "lanes.toml"
LANES_LOCK = "lanes.lock"
LANES_LOCK_VERSION = "1"
DEVICES = ("CPU", "TPU")


class LaneError(PipelineError):
    """The lanes configuration or state is wrong, or a lane refuses a bundle."""


@dataclass(frozen=True)
class Policy:
    device: str | None = None
    checks: tuple[str, ...] = ()
    max_warm_regression: float | None = None

    @property
    def empty(self) -> bool:
        return self.device is None and not self.checks and self.max_warm_regression is None


@dataclass(frozen=True)
class Lane:
    name: str
    description: str
    path: Path | None
    """A static index directory (absolute), or None for a remote index."""
    index_url: str | None
    upload_url: str | None
    promote_from: str | None
    policy: Policy

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
    )
    device, tolerance = fields["device"], fields["max-warm-regression"]
    if device is not None and device not in DEVICES:
        raise table.fail("device", f"{device!r} is not one of {DEVICES}", "")
    if tolerance is not None and tolerance < 0:
        raise table.fail("max-warm-regression", "must be a number >= 0", "")
    return Policy(device, tuple(fields["checks"]), None if tolerance is None else float(tolerance))


def load_config(root: Path) -> LanesConfig:
    path = root / LANES_CONFIG
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise LaneError(
            f"{path} does not exist", fix='create it (README "Releasing to the fleet" shows one)'
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise LaneError(f"{path}: TOML: {error}", fix=_format_fix(path)) from error
    top = Table(data, source=str(path), error=LaneError, fix=_format_fix(path))
    publish_lane = top.read(
        Field("publish-lane", str, default="validation"), Field("lanes", dict, default={})
    )["publish-lane"]
    lanes: dict[str, Lane] = {}
    for name, table in top.tables("lanes").items():
        fields = table.read(
            Field("description", str, default=""),
            Field("path", str),
            Field("index-url", str),
            Field("upload-url", str),
            Field("promote-from", str),
            Field("policy", dict, default={}),
        )
        if (fields["path"] is None) == (fields["index-url"] is None):
            raise table.fail("path", "give exactly one of path or index-url", "")
        index_url = fields["index-url"]
        if index_url and not index_url.endswith("/"):
            index_url = f"{index_url}/"
        lanes[name] = Lane(
            name=name,
            description=fields["description"],
            path=None if fields["path"] is None else (root / fields["path"]).resolve(),
            index_url=index_url,
            upload_url=fields["upload-url"],
            promote_from=fields["promote-from"],
            policy=_policy(table.table("policy", optional=True)),
        )
        if fields["promote-from"] is not None and fields["promote-from"] not in data["lanes"]:
            raise table.fail("promote-from", f"no lane {fields['promote-from']!r}", "")
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
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise LaneError(f"{path} is not valid TOML: {error}", fix=restore) from error
    if data.get("lanes-lock-version") != LANES_LOCK_VERSION:
        raise LaneError(f"{path} has an unknown lanes-lock-version", fix=restore)
    top = Table(data, source=str(path), error=LaneError, fix=restore)
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
