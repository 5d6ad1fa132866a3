"""The provenance file inside our torch_xla wheel: one schema for its writer and readers.

The provenance records the wheel's inputs only: each component's full commit, version and
patch digests, the build settings, and (added by the builder's ``stamp-provenance`` step
when the wheel exists) the versions, toolchain and torch_xla's own ``openxla_patches``.
Never the bundle that first asked for the wheel: bundles with the same inputs (a libtpu
bump) share one stage-cache entry and so the very same bytes, and a bundle name, manifest
digest or remote URL in the file would be wrong for all but the first. Readers judge a
wheel by comparing these inputs (and its sha256) with the bundle's ``wheels.lock`` entry.

The build stage composes a :class:`Provenance`, the stamp step completes it and writes
:meth:`Provenance.to_bytes` into the wheel at :data:`PROVENANCE_PATH`. ``verify-install``
and ``doctor`` read it back with :meth:`Provenance.from_json`, which names what is wrong
with a file that does not follow this schema instead of guessing. Files written before the
inputs-only rule carry ``bundle``, ``manifest_sha256`` and per-component ``remote``
fields: :meth:`Provenance.from_json` accepts and ignores them (:data:`RETIRED_FIELDS`).

Standard library only (and ``tables``, which is too): the builder image runs this module
without pipeline dependencies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from xla_host.tables import Field, Table

PACKAGE = "torch_xla"
PROVENANCE_NAME = "_xla_wheels_provenance.json"
PROVENANCE_PATH = f"{PACKAGE}/{PROVENANCE_NAME}"
"""Where the file is inside the wheel (and inside site-packages once installed)."""


RETIRED_FIELDS = ("bundle", "manifest_sha256")
"""Top-level fields of older files, ignored when read (with each component's ``remote``)."""


class ProvenanceFormatError(ValueError):
    """The file does not follow the schema; the message names the field.

    Its readers (doctor, verify-install) give their own fix: install the bundle's wheel.
    """

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)


@dataclass(frozen=True)
class PatchDigest:
    path: str
    sha256: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def read_patches(table: Table, key: str) -> tuple[PatchDigest, ...]:
    """The rows ``key`` of ``table`` (absent: none), each a patch's path and sha256."""
    fields = (Field("path", str, required=True), Field("sha256", str, required=True))
    return tuple(PatchDigest(**row.read(*fields)) for row in table.rows(key) or [])


@dataclass(frozen=True)
class ComponentProvenance:
    commit: str
    version: str | None
    patches: tuple[PatchDigest, ...]
    series_sha256: str

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "patches": [patch.to_json() for patch in self.patches]}

    @classmethod
    def from_json(cls, table: Table) -> ComponentProvenance:
        fields = table.read(
            Field("commit", str, required=True),
            Field("version", str),
            Field("patches", list, required=True),
            Field("series_sha256", str, required=True),
            # An older file's ``remote`` is ignored: a URL is where the commit was fetched
            # from, not an input (the same commit from a mirror makes the same wheel).
            ignored=("remote",),
        )
        return cls(
            commit=fields["commit"],
            version=fields["version"],
            patches=read_patches(table, "patches"),
            series_sha256=fields["series_sha256"],
        )


@dataclass(frozen=True)
class BuildSettings:
    mode: str
    """``container`` or ``host``."""
    engine: str
    image: str | None
    knobs: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "knobs": dict(self.knobs)}

    @classmethod
    def from_json(cls, table: Table) -> BuildSettings:
        return cls(
            **table.read(
                Field("mode", str, required=True),
                Field("engine", str, required=True),
                Field("image", str),
                Field("knobs", dict, required=True),
            )
        )


@dataclass(frozen=True)
class Provenance:
    built_by: str
    build: BuildSettings
    components: Mapping[str, ComponentProvenance]
    # Added by the builder's stamp step, when the wheel exists:
    torch_version: str | None = None
    torch_xla_version: str | None = None
    toolchain: Mapping[str, str] = field(default_factory=dict)
    torch_xla_openxla_patches: tuple[PatchDigest, ...] = ()

    def stamped(
        self,
        *,
        torch_version: str,
        torch_xla_version: str,
        toolchain: Mapping[str, str],
        openxla_patches: tuple[PatchDigest, ...],
    ) -> Provenance:
        return replace(
            self,
            torch_version=torch_version,
            torch_xla_version=torch_xla_version,
            toolchain=dict(toolchain),
            torch_xla_openxla_patches=openxla_patches,
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "built_by": self.built_by,
            "build": self.build.to_json(),
            "components": {name: c.to_json() for name, c in self.components.items()},
        }
        if self.torch_xla_version is not None:
            data["torch_version"] = self.torch_version
            data["torch_xla_version"] = self.torch_xla_version
            data["toolchain"] = dict(self.toolchain)
            data["torch_xla_openxla_patches"] = [
                p.to_json() for p in self.torch_xla_openxla_patches
            ]
        return data

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: object) -> Provenance:
        """Raises :class:`ProvenanceFormatError` naming the first field that is wrong."""
        if not isinstance(data, Mapping):
            raise ProvenanceFormatError("the provenance is not a JSON object")
        top = Table(data, source="", error=ProvenanceFormatError)
        fields = top.read(
            Field("built_by", str, required=True),
            Field("build", dict, required=True),
            Field("components", dict, required=True),
            Field("torch_version", str),
            Field("torch_xla_version", str),
            Field("toolchain", dict, default={}),
            Field("torch_xla_openxla_patches", list, default=[]),
            # RETIRED_FIELDS of older files are not read: identity is the inputs.
            ignored=RETIRED_FIELDS,
        )
        return cls(
            built_by=fields["built_by"],
            build=BuildSettings.from_json(top.table("build")),
            components={
                name: ComponentProvenance.from_json(table)
                for name, table in top.tables("components").items()
            },
            torch_version=fields["torch_version"],
            torch_xla_version=fields["torch_xla_version"],
            toolchain={str(k): str(v) for k, v in fields["toolchain"].items()},
            torch_xla_openxla_patches=read_patches(top, "torch_xla_openxla_patches"),
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> Provenance:
        try:
            data = json.loads(raw)
        except ValueError as error:
            raise ProvenanceFormatError(f"not JSON: {error}") from None
        return cls.from_json(data)
