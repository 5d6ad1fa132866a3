"""What the build owns and reads inside the upstream trees (torch, torch_xla, OpenXLA).

Upstream's layout builds torch_xla from ``<torch>/xla`` (its Bazel WORKSPACE loads PyTorch
from ``../``), so the torch_xla recipe copies the torch_xla worktree there after an
``rm -rf`` of it, on every build; and it applies the ``openxla_patches/`` that torch_xla's
WORKSPACE lists to the OpenXLA worktree. The recipes do both, the worktree guard and the
patch stage must recognise both as the build's own doing: this module is where they agree.

Standard library only: the builder image runs it (``builder.run_recipe``).
"""

from __future__ import annotations

import re
from pathlib import Path

TORCH_XLA_IN_TORCH = "xla"
"""Where, inside the torch worktree, torch_xla is built: ``<torch>/xla``."""

BUILD_OWNED: dict[str, tuple[str, ...]] = {"torch": (TORCH_XLA_IN_TORCH + "/",)}
"""Paths inside a component's worktree that the build itself owns (the copy at
``<torch>/xla``). Nothing there is the user's: it never blocks a reuse or a recreation."""

OPENXLA_PATCHES = "openxla_patches"
"""torch_xla's directory of patches onto OpenXLA, listed in its WORKSPACE."""

_ARCHIVE = re.compile(r"http_archive\((.*?)\n\)", re.DOTALL)
_XLA_PATCH = re.compile(r'"//openxla_patches:([^"]+)"')


def workspace_openxla_patches(tree: Path) -> list[str]:
    """File names of the patches WORKSPACE's ``xla`` http_archive applies, in order."""
    workspace = tree / "WORKSPACE"
    if not workspace.exists():
        return []
    for match in _ARCHIVE.finditer(workspace.read_text(encoding="utf-8")):
        body = match.group(1)
        if re.search(r'name\s*=\s*"xla"', body):
            return _XLA_PATCH.findall(body)
    return []
