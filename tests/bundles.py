"""The one helper that writes bundle manifests for the tests (``build/bundles/<name>.toml``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

LIBTPU_RUNTIME = '[runtime.libtpu]\nminimum = "0.0.24"\npreferred = "0.0.36"\n'


@dataclass(frozen=True)
class Pin:
    """One ``[components.<name>]`` table."""

    remote: str
    commit: str
    version: str | None = None
    patches: Sequence[str] = ()
    """Paths under ``patches/``, in series order."""
    submodules: bool | None = False
    """None leaves the key out (the manifest's default applies)."""


def manifest_text(
    name: str,
    components: Mapping[str, Pin],
    *,
    python: str = "3.11",
    description: str = "test",
    runtime: str = "",
    build: Mapping[str, bool | int] | None = None,
) -> str:
    """The manifest's TOML text; ``runtime`` is raw ``[runtime.*]`` TOML."""
    blocks = [f'[bundle]\nname = "{name}"\ndescription = "{description}"\npython = "{python}"\n']
    for component, pin in components.items():
        lines = [
            f"[components.{component}]",
            f'remote = "{pin.remote}"',
            f'commit = "{pin.commit}"',
        ]
        if pin.version:
            lines.append(f'version = "{pin.version}"')
        if pin.submodules is not None:
            lines.append(f"submodules = {'true' if pin.submodules else 'false'}")
        lines.append("patches = [" + ", ".join(f'"{p}"' for p in pin.patches) + "]")
        blocks.append("\n".join(lines) + "\n")
    if runtime:
        blocks.append(runtime)
    if build:
        values = (
            f"{key} = {str(value).lower() if isinstance(value, bool) else value}"
            for key, value in build.items()
        )
        blocks.append("[build]\n" + "\n".join(values) + "\n")
    return "\n".join(blocks)


def write_bundle(
    project: Path,
    name: str,
    components: Mapping[str, Pin],
    *,
    python: str = "3.11",
    description: str = "test",
    runtime: str = "",
    build: Mapping[str, bool | int] | None = None,
) -> Path:
    """Write ``<project>/build/bundles/<name>.toml`` (see :func:`manifest_text`)."""
    path = project / "build" / "bundles" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = manifest_text(
        name, components, python=python, description=description, runtime=runtime, build=build
    )
    path.write_text(text)
    return path
