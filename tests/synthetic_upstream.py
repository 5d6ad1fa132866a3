"""The stand-in upstream (:mod:`xla_wheels.stand_in`, which ``make demo`` builds too) as
the build-stage tests use it: a throwaway project root whose bundle ``syn`` pins the
three repositories with a three-patch series, and cheap copies of it."""

from __future__ import annotations

import itertools
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.bundles import Pin, write_bundle
from xla_wheels.stand_in import (
    SHIP_CHECK,
    TORCH_C_EXTENSION,
    WORKSPACE,
    bazelrc_words,
    make_stand_in,
    wheels_flags,
    write_patch,
)

__all__ = ["SHIP_CHECK", "TORCH_C_EXTENSION", "bazelrc_words", "make_patch"]

PYTHON_MINOR = f"{sys.version_info[0]}.{sys.version_info[1]}"

make_patch = write_patch


@dataclass
class Synthetic:
    root: Path
    """The throwaway project root (build/bundles, patches/, wheels.lock, dist/)."""
    cache: Path
    upstream: Path
    commits: dict[str, str]

    def bundle_path(self, name: str = "syn") -> Path:
        return self.root / "build" / "bundles" / f"{name}.toml"

    def write_bundle(
        self,
        name: str = "syn",
        *,
        xla_patches: tuple[str, ...] = (
            "torch_xla/0001-load-cache.patch",
            "torch_xla/0002-comment.patch",
        ),
        openxla_commit: str | None = None,
        openxla_patches: tuple[str, ...] = ("openxla/0001-api.patch",),
        torch_patches: tuple[str, ...] = (),
    ) -> Path:
        pins = {
            "torch": Pin(
                str(self.upstream / "torch"),
                self.commits["torch"],
                "2.9.0a0",
                torch_patches,
                submodules=False,
            ),
            "torch_xla": Pin(
                str(self.upstream / "xla"), self.commits["torch_xla"], "2.9.0", xla_patches
            ),
            "openxla": Pin(
                str(self.upstream / "openxla"),
                openxla_commit or self.commits["openxla"],
                patches=openxla_patches,
            ),
        }
        return write_bundle(
            self.root,
            name,
            pins,
            python=PYTHON_MINOR,
            description="synthetic upstream (test data)",
            build={
                "bundle_libtpu": False,
                "tpuvm_mode": True,
                "build_cpp_tests": False,
                "cxx_abi": 1,
            },
        )


def make_synthetic(base: Path, *, c_extension: bool = False) -> Synthetic:
    """The stand-in's repositories (torch_xla's in ``upstream/xla``) and a project root
    with the stand-in's series plus ``torch_xla/0002-comment.patch``; ``c_extension`` as
    :func:`xla_wheels.stand_in.make_stand_in`."""
    upstream, root = base / "upstream", base / "project"
    stand_in = make_stand_in(upstream, who="synthetic", xla_dir="xla", c_extension=c_extension)
    (root / "build" / "bundles").mkdir(parents=True)
    stand_in.write_series(root / "patches")
    workspace = stand_in.text(WORKSPACE, "PyTorch/XLA") + "# patched\n"
    stand_in.patch(
        "torch_xla", "a second, harmless patch", {"WORKSPACE": workspace},
        root / "patches" / "torch_xla" / "0002-comment.patch",
    )  # fmt: skip
    synthetic = Synthetic(root, base / "cache", upstream, dict(stand_in.commits))
    synthetic.write_bundle()
    return synthetic


def save_synthetic(syn: Synthetic, path: Path) -> None:
    """What ``load_synthetic`` needs besides the directories: the commits."""
    path.write_text(json.dumps(syn.commits))


def load_synthetic(base: Path, saved: Path) -> Synthetic:
    """The project ``make_synthetic(base)`` made, its commits read from ``saved``."""
    commits = json.loads(saved.read_text())
    return Synthetic(base / "project", base / "cache", base / "upstream", commits)


def copy_synthetic(template: Synthetic, base: Path) -> Synthetic:
    """A private copy in ``base`` of a project ``make_synthetic`` made: the same commits
    (fixed dates), its bundle naming the copy's repositories. Cheaper than making it again,
    and a test may change its copy freely."""
    upstream, root = base / "upstream", base / "project"
    shutil.copytree(template.upstream, upstream, symlinks=True)
    shutil.copytree(template.root, root, symlinks=True)
    commits = dict(template.commits)
    copy = Synthetic(root=root, cache=base / "cache", upstream=upstream, commits=commits)
    copy.write_bundle()
    return copy


def cli_args(syn: Synthetic, *extra: str, bundle: str = "syn") -> list[str]:
    """`xla-wheels wheels` for the synthetic root, sized for a test (1 job, tiny disk)."""
    flags = {"--root": str(syn.root), "--bundle": bundle, **wheels_flags(syn.cache)}
    return ["wheels", *itertools.chain.from_iterable(flags.items()), *extra]
