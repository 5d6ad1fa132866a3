"""The build spec: everything a recipe needs, as JSON the in-container entry point reads.

Paths are absolute and identical inside and outside the container (the engine mounts each
directory at its own path), so a spec, a log line or a ``.git`` file written on one side
means the same on the other, and BUILD_MODE=host runs the very same spec.

This module imports only the standard library (it runs inside the builder image).
"""

from __future__ import annotations

import hashlib
import json
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xla_host import filemode
from xla_wheels import wheel_stamp

# Bump when a recipe changes in a way that changes the wheels: invalidates the stage cache.
RECIPE_VERSION = "3"  # 2: wheels re-packed reproducibly, provenance without a bundle; 3: SBOM

STAGE_RECORD = "stage.json"  # its wheel's name and sha256, written after each step that changes it


@dataclass(frozen=True)
class BuildSpec:
    bundle: str
    python: str
    torch_src: str
    torch_xla_worktree: str
    torch_xla_tree: str
    """``<torch_src>/xla``: where torch_xla is built (its Bazel WORKSPACE loads ``../``)."""
    openxla_src: str
    openxla_revision: str
    """What torch_xla's key names as its OpenXLA (``TORCH_XLA_OPENXLA_REVISION``, series 0003):
    the pinned commit, plus the digest of the bundle's OpenXLA patches when it has any."""
    buildenv: str
    """``pip install --target`` directory holding the built torch and build requirements."""
    logs: str
    torch_version: str
    torch_xla_version: str
    torch_stage: str
    torch_xla_stage: str
    jobs: int
    knobs: dict[str, Any]
    bazel_disk_cache: str
    bazel_output_root: str
    ccache_dir: str
    pip_cache_dir: str
    pip_args: list[str]
    compiler_env: dict[str, str]
    extra_env: dict[str, str]
    ship_env: str
    ship_out: str
    ship_check: str
    ship_pip_args: list[str]
    pipeline_src: list[str]
    """The directories holding the ``xla_wheels`` and ``xla_host`` packages (each mounted
    read-only at the same path, and on PYTHONPATH in this order)."""
    remote_cache: dict[str, Any] = field(default_factory=dict)
    """``RemoteCacheSettings.to_dict()``: URLs, role, header names; never a credential."""
    private_dir: str = ""
    """0700 directory for credential-bearing files (the secrets file, Bazel's auth rc)."""
    provenance: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> BuildSpec:
        return cls(**json.loads(path.read_text(encoding="utf-8")))


def stage_key(inputs: dict[str, Any]) -> str:
    """sha256 over a stage's inputs (sorted JSON): same inputs, same key, reused wheel."""
    blob = json.dumps({"recipe": RECIPE_VERSION, **inputs}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def sha256_of(path: Path) -> str:
    return filemode.file_sha256(path)  # a FIFO in the stage cache is refused, not waited on


def record_stage(wheel: Path) -> None:
    """Record the stage's wheel as it is now (the recipe, then the host after the SBOM)."""
    record = {"wheel": wheel.name, "sha256": sha256_of(wheel)}
    filemode.write_by_rename(wheel.parent / STAGE_RECORD, json.dumps(record, indent=2) + "\n")


def built_wheel(directory: Path) -> Path | None:
    """The wheel the stage's record names, when its bytes match the record: what the
    recipe left, whether or not the host has finished the stage (the SBOM) yet."""
    with suppress(OSError, ValueError, KeyError, TypeError):  # no record: nothing built
        # The stage cache is a shared directory: a FIFO there is refused, never opened.
        raw = filemode.read_shared(directory / STAGE_RECORD, what="stage record")
        data = json.loads(raw.decode("utf-8"))
        wheel = directory / data["wheel"]
        if wheel.is_file() and sha256_of(wheel) == data["sha256"]:
            return wheel
    return None


def stage_wheel(directory: Path) -> Path | None:
    """The stage's wheel when every step of the stage finished, the SBOM, added on the
    host after the recipe, included: the record matches the wheel and the wheel carries
    its SBOM. A stage a run left without its SBOM (interrupted, or a recipe that ran on
    after its pipeline ended) is never reused: it is built again."""
    wheel = built_wheel(directory)
    return wheel if wheel is not None and wheel_stamp.sbom_path_in(wheel) else None


def unfinished(directory: Path) -> str | None:
    """Why the stage in ``directory`` is there but not reusable; None when it is finished
    or was never started."""
    if stage_wheel(directory) is not None or not directory.is_dir():
        return None
    if built_wheel(directory) is not None:
        return (
            f"its wheel has no .dist-info/sboms/{wheel_stamp.SBOM_NAME}: the run stopped "
            "after the recipe and before the SBOM step"
        )
    return "it has no finished wheel: the run stopped during the recipe"
