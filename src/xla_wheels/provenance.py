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

Standard library only: the builder image runs this module without pipeline dependencies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

PACKAGE = "torch_xla"
PROVENANCE_NAME = "_xla_wheels_provenance.json"
PROVENANCE_PATH = f"{PACKAGE}/{PROVENANCE_NAME}"
"""Where the file is inside the wheel (and inside site-packages once installed)."""


RETIRED_FIELDS = ("bundle", "manifest_sha256")
"""Top-level fields of older files, ignored when read (with each component's ``remote``)."""


class ProvenanceFormatError(ValueError):
    """The file does not follow the schema; the message names the field."""


def _get(data: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise ProvenanceFormatError(f"{where}{key} is missing or not a {kind.__name__}")
    return value


@dataclass(frozen=True)
class PatchDigest:
    path: str
    sha256: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: object, where: str) -> PatchDigest:
        if not isinstance(data, Mapping):
            raise ProvenanceFormatError(f"{where} is not an object")
        return cls(_get(data, "path", str, where + "."), _get(data, "sha256", str, where + "."))


def _patches(data: object, where: str) -> tuple[PatchDigest, ...]:
    if not isinstance(data, list):
        raise ProvenanceFormatError(f"{where} is not a list")
    return tuple(PatchDigest.from_json(row, f"{where}[{i}]") for i, row in enumerate(data))


@dataclass(frozen=True)
class ComponentProvenance:
    commit: str
    version: str | None
    patches: tuple[PatchDigest, ...]
    series_sha256: str

    def to_json(self) -> dict[str, Any]:
        return {
            "commit": self.commit,
            "version": self.version,
            "patches": [patch.to_json() for patch in self.patches],
            "series_sha256": self.series_sha256,
        }

    @classmethod
    def from_json(cls, data: object, where: str) -> ComponentProvenance:
        if not isinstance(data, Mapping):
            raise ProvenanceFormatError(f"{where} is not an object")
        version = data.get("version")
        if version is not None and not isinstance(version, str):
            raise ProvenanceFormatError(f"{where}.version is not a string")
        # An older file's ``remote`` is ignored: a URL is where the commit was fetched
        # from, not an input (the same commit from a mirror makes the same wheel).
        return cls(
            commit=_get(data, "commit", str, where + "."),
            version=version,
            patches=_patches(data.get("patches"), f"{where}.patches"),
            series_sha256=_get(data, "series_sha256", str, where + "."),
        )


@dataclass(frozen=True)
class BuildSettings:
    mode: str
    """``container`` or ``host``."""
    engine: str
    image: str | None
    knobs: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "engine": self.engine,
            "image": self.image,
            "knobs": dict(self.knobs),
        }

    @classmethod
    def from_json(cls, data: object) -> BuildSettings:
        if not isinstance(data, Mapping):
            raise ProvenanceFormatError("build is missing or not an object")
        image = data.get("image")
        if image is not None and not isinstance(image, str):
            raise ProvenanceFormatError("build.image is not a string")
        return cls(
            mode=_get(data, "mode", str, "build."),
            engine=_get(data, "engine", str, "build."),
            image=image,
            knobs=dict(_get(data, "knobs", Mapping, "build.")),
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
        components = _get(data, "components", Mapping, "")
        toolchain = data.get("toolchain", {})
        if not isinstance(toolchain, Mapping):
            raise ProvenanceFormatError("toolchain is not an object")
        torch_version = data.get("torch_version")
        torch_xla_version = data.get("torch_xla_version")
        for key, value in (
            ("torch_version", torch_version),
            ("torch_xla_version", torch_xla_version),
        ):
            if value is not None and not isinstance(value, str):
                raise ProvenanceFormatError(f"{key} is not a string")
        # RETIRED_FIELDS of older files are not read: identity is the inputs.
        return cls(
            built_by=_get(data, "built_by", str, ""),
            build=BuildSettings.from_json(data.get("build")),
            components={
                str(name): ComponentProvenance.from_json(value, f"components.{name}")
                for name, value in components.items()
            },
            torch_version=torch_version,
            torch_xla_version=torch_xla_version,
            toolchain={str(k): str(v) for k, v in toolchain.items()},
            torch_xla_openxla_patches=_patches(
                data.get("torch_xla_openxla_patches", []), "torch_xla_openxla_patches"
            ),
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> Provenance:
        try:
            data = json.loads(raw)
        except ValueError as error:
            raise ProvenanceFormatError(f"not JSON: {error}") from None
        return cls.from_json(data)
