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

LANES_CONFIG = Path("build") / "lanes.toml"
LANES_LOCK = "lanes.lock"
LANES_LOCK_VERSION = "1"
DEVICES = ("CPU", "TPU")
#: ``backend`` values: ``index`` (a static directory or any PEP 503 index; the default)
#: and ``devpi`` (an index of a devpi server: uploads to it, promotion by devpi's push).
BACKENDS = ("index", "devpi")


class LaneError(PipelineError):
    """The lanes configuration or state is wrong, or a lane refuses a bundle."""


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
        return (
            self.profile is None
            and self.device is None
            and not self.checks
            and self.max_warm_regression is None
            and self.max_memory_regression is None
        )


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


def _bad(path: Path, where: str, problem: str) -> LaneError:
    return LaneError(
        f"{path}: {where}: {problem}",
        fix=f"edit {path} (format: its header comment " 'and README "Releasing to the fleet")',
    )


def _policy(path: Path, lane: str, data: Mapping[str, Any]) -> Policy:
    unknown = set(data) - {
        "device",
        "checks",
        "max-warm-regression",
        "max-memory-regression",
        "profile",
    }
    if unknown:
        raise _bad(path, f"lanes.{lane}.policy", f"unknown key(s) {', '.join(sorted(unknown))}")
    device = data.get("device")
    if device is not None and device not in DEVICES:
        raise _bad(path, f"lanes.{lane}.policy.device", f"{device!r} is not one of {DEVICES}")
    checks = data.get("checks", [])
    if not isinstance(checks, list) or not all(isinstance(c, str) for c in checks):
        raise _bad(path, f"lanes.{lane}.policy.checks", "must be a list of check names")
    tolerances: dict[str, float | None] = {}
    for key in ("max-warm-regression", "max-memory-regression"):
        tolerance = data.get(key)
        if tolerance is not None and (
            isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or tolerance < 0
        ):
            raise _bad(path, f"lanes.{lane}.policy.{key}", "must be a number >= 0")
        tolerances[key] = None if tolerance is None else float(tolerance)
    profile = data.get("profile")
    if profile is not None and (not isinstance(profile, str) or not profile):
        raise _bad(path, f"lanes.{lane}.policy.profile", "must be a launch profile name")
    return Policy(
        device,
        tuple(checks),
        tolerances["max-warm-regression"],
        tolerances["max-memory-regression"],
        profile,
    )


def _devpi_lane(path: Path, name: str, raw: Mapping[str, Any]) -> Lane:
    """A lane that is one index (``user/index``) of a devpi server."""
    unknown = set(raw) - {"description", "backend", "server", "index", "promote-from", "policy"}
    if unknown:
        raise _bad(
            path,
            f"lanes.{name}",
            f"unknown key(s) {', '.join(sorted(unknown))} for backend devpi "
            "(a devpi lane is `server` and `index`)",
        )
    server = raw.get("server")
    if not isinstance(server, str) or not server.startswith(("http://", "https://")):
        raise _bad(path, f"lanes.{name}.server", "must be the devpi server's http(s) URL")
    index = raw.get("index")
    if not isinstance(index, str) or len(index.strip("/").split("/")) != 2:
        raise _bad(path, f"lanes.{name}.index", 'must be "<user>/<index>", e.g. "team/validation"')
    index = index.strip("/")
    base = f"{server.rstrip('/')}/{index}/"
    return Lane(
        name=name,
        description=str(raw.get("description", "")),
        path=None,
        # devpi's own layout: the simple page under +simple/, uploads to the index URL.
        index_url=f"{base}+simple/",
        upload_url=base,
        promote_from=raw.get("promote-from"),
        policy=_policy(path, name, raw.get("policy", {})),
        backend="devpi",
        devpi_index=index,
    )


def _signing_key(root: Path, path: Path, lane: str, raw: Mapping[str, Any]) -> Path | None:
    required = raw.get("require-signature", False)
    if not isinstance(required, bool):
        raise _bad(path, f"lanes.{lane}.require-signature", "must be true or false")
    key = raw.get("signing-public-key")
    if required != (key is not None):
        raise _bad(
            path,
            f"lanes.{lane}",
            "require-signature = true needs signing-public-key (the team's public key, a PEM "
            "file relative to the checkout), and the key is read only when it is required",
        )
    return (root / str(key)).resolve() if required else None


def load_config(root: Path) -> LanesConfig:
    path = root / LANES_CONFIG
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise LaneError(
            f"{path} does not exist", fix='create it (README "Releasing to the fleet" shows one)'
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise _bad(path, "TOML", str(error)) from error
    lanes: dict[str, Lane] = {}
    for name, raw in dict(data.get("lanes", {})).items():
        if raw.get("backend", "index") == "devpi":
            lanes[name] = _devpi_lane(path, name, raw)
            continue
        unknown = set(raw) - {
            "description",
            "path",
            "index-url",
            "upload-url",
            "promote-from",
            "policy",
            "backend",
            "require-signature",
            "signing-public-key",
        }
        if unknown:
            raise _bad(path, f"lanes.{name}", f"unknown key(s) {', '.join(sorted(unknown))}")
        if raw.get("backend", "index") not in BACKENDS:
            raise _bad(
                path, f"lanes.{name}.backend", f"{raw['backend']!r} is not one of {BACKENDS}"
            )
        if ("path" in raw) == ("index-url" in raw):
            raise _bad(path, f"lanes.{name}", "give exactly one of path or index-url")
        index_url = raw.get("index-url")
        if index_url and not str(index_url).endswith("/"):
            index_url = f"{index_url}/"
        lanes[name] = Lane(
            name=name,
            description=str(raw.get("description", "")),
            path=(root / raw["path"]).resolve() if "path" in raw else None,
            index_url=index_url,
            upload_url=raw.get("upload-url"),
            promote_from=raw.get("promote-from"),
            policy=_policy(path, name, raw.get("policy", {})),
            signing_public_key=_signing_key(root, path, name, raw),
        )
    if not lanes:
        raise _bad(path, "lanes", "no lane is defined")
    publish_lane = str(data.get("publish-lane", "validation"))
    for lane in lanes.values():
        for ref, what in ((lane.promote_from, "promote-from"),):
            if ref is not None and ref not in lanes:
                raise _bad(path, f"lanes.{lane.name}.{what}", f"no lane {ref!r}")
    if publish_lane not in lanes:
        raise _bad(path, "publish-lane", f"no lane {publish_lane!r}")
    return LanesConfig(path, publish_lane, lanes)


def read_state(root: Path) -> dict[str, LaneState]:
    path = root / LANES_LOCK
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise LaneError(
            f"{path} is not valid TOML: {error}",
            fix=f"restore it from git (`git checkout -- {LANES_LOCK}`)",
        ) from error
    if data.get("lanes-lock-version") != LANES_LOCK_VERSION:
        raise LaneError(
            f"{path} has an unknown lanes-lock-version",
            fix=f"restore it from git (`git checkout -- {LANES_LOCK}`)",
        )
    return {
        name: LaneState(
            bundle=str(entry["bundle"]),
            wheels=tuple((str(w["name"]), str(w["sha256"])) for w in entry.get("wheels", [])),
            receipt=entry.get("receipt"),
            receipt_digest=entry.get("receipt-digest"),
        )
        for name, entry in data.get("lanes", {}).items()
    }


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
