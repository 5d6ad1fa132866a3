"""Stage 1, resolve: read and validate a bundle manifest.

A bundle (``build/bundles/<name>.toml``) pins everything one set of wheels is built from:
each component's git remote, commit and patch series, the runtime wheels that go with
it (libtpu, jax), the Python version, the versions to stamp and the build knobs.

A bundle may extend another (``extends = "v6e-2.9"`` in ``[bundle]``) and override only
what differs. Inheritance is resolved here, at load: every later stage (and the lock)
sees the resolved pins, never the chain. Merge rules, chosen so that an override can
never leave a half of the parent's pin behind:

- ``[bundle]``: ``python`` is inherited; ``name`` and ``description`` are the child's own.
- ``[components.<name>]``: key by key; a child's ``commit`` replaces the parent's
  ``unpinned`` and the other way round. The patch series is the exception: a child's
  ``patches`` are added after the parent's series, never in its place (a list copied
  from the docs' "add one line" must not silently drop the parent's patches), and a
  parent's patch leaves the series only by name, in ``drop_patches``, which is refused
  for a patch the parent does not carry. Each patch keeps the bundle that put it in the
  series (:attr:`PatchRef.bundle`), so ``make bundles`` and ``make diff`` say where it
  comes from.
- ``[runtime.<name>]``: replaced as a whole table (an exact ``version`` and
  ``minimum``/``preferred`` exclude each other).
- ``[build]``: key by key.
- ``[profiles.<name>]``: by profile, then group by group (:mod:`xla_host.launch_profile`).

Validation is strict on purpose: an unknown key is almost always a typo that would
otherwise be silently ignored, so every problem is a :class:`ManifestError` naming the
file, the key and the fix.
"""

from __future__ import annotations

import copy
import hashlib
import json
import posixpath
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path, PurePosixPath
from typing import Any

from xla_host import launch_profile
from xla_host.errors import ManifestError, UsageError
from xla_host.tables import Field, Table, check_regular, loads_toml, read_utf8
from xla_host.values import NAME_PATTERN, NAME_RULE, REMOTE_RULE, BadValue, check_remote

#: Bundle names become directories (out/<bundle>, dist/<bundle>) and command arguments.
_BAD_NAME = f"is not a valid bundle name ({NAME_RULE})"

COMPONENT_NAMES = ("torch", "torch_xla", "openxla")
"""Build order; OpenXLA is not built on its own but consumed by torch_xla's Bazel build."""

RUNTIME_NAMES = ("libtpu", "jax", "jaxlib")

#: Each component's upstream, the example a bad ``remote`` is answered with.
UPSTREAM_REMOTES = {
    "torch": "https://github.com/pytorch/pytorch.git",
    "torch_xla": "https://github.com/pytorch/xla.git",
    "openxla": "https://github.com/openxla/xla.git",
}

_HEX = re.compile(r"[0-9a-f]+")
# ASCII digits only (``\d`` alone would take any script's digits).
_VERSION = re.compile(r"\d+(\.\d+)*([a-z]+\d+)?", re.ASCII)
_PYTHON = re.compile(r"3\.\d+", re.ASCII)
_MIN_SHORT_SHA = 7


@dataclass(frozen=True)
class PatchRef:
    """One patch file of a series, as a path relative to ``patches/``."""

    relpath: str
    path: Path
    bundle: str = field(default="", compare=False)
    """The bundle whose manifest lists it: the bundle itself, or the ancestor it inherits
    the patch from. Shown, never compared: the same file is the same patch of a series
    whichever bundle lists it."""

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Component:
    name: str
    remote: str
    commit: str | None
    """Full or short hex SHA as written in the manifest; ``None`` when not pinned yet."""
    unpinned_reason: str | None
    version: str | None
    """Public version to stamp on the wheel (torch, torch_xla); OpenXLA has none."""
    submodules: bool
    patches: tuple[PatchRef, ...]
    """The effective series, in the order it is applied: inherited patches first."""
    dropped: tuple[tuple[str, str], ...] = ()
    """(patch relpath, bundle whose ``drop_patches`` names it) for each inherited patch
    left out of the series, oldest ancestor first."""

    @property
    def is_full_sha(self) -> bool:
        return self.commit is not None and len(self.commit) == 40


@dataclass(frozen=True)
class RuntimePin:
    """A public runtime wheel that training hosts install next to ours."""

    name: str
    version: str | None
    """Exact version (``==``); when set, ``minimum`` and ``preferred`` are not."""
    minimum: str | None
    preferred: str | None

    @property
    def specifier(self) -> str:
        if self.version:
            return f"=={self.version}"
        return f">={self.minimum}"

    @property
    def install_version(self) -> str:
        """The one version a host installs (the exact pin, else the preferred one)."""
        return self.version or self.preferred or self.minimum or ""


@dataclass(frozen=True)
class BuildKnobs:
    """What the build stage passes to torch_xla's setup.py and Bazel."""

    bundle_libtpu: bool
    tpuvm_mode: bool
    build_cpp_tests: bool
    cxx_abi: int


@dataclass(frozen=True)
class Bundle:
    name: str
    path: Path
    description: str
    python: str
    components: Mapping[str, Component]
    runtime: Mapping[str, RuntimePin]
    build: BuildKnobs
    manifest_sha256: str
    """sha256 of the manifest file; for a bundle that extends another, of the file and its
    parent's ``manifest_sha256``, so editing a parent changes every descendant's digest."""
    extends: str | None = None
    """The parent bundle's name, as written in ``[bundle] extends``."""
    profiles: Mapping[str, launch_profile.LaunchProfile] = field(default_factory=dict)
    """Launch profiles by name (``[profiles.<name>]``, resolved through ``extends``)."""
    build_sha256: str = ""
    """The build's identity: sha256 of what the resolved manifest puts into the wheels
    (:func:`build_digest`). Wheels recorded for one build identity still hold when only a
    launch profile, a runtime pin, the description or a comment changed."""

    def component(self, name: str) -> Component:
        return self.components[name]

    def unresolved_pins(self) -> list[str]:
        """Human lines for every component that cannot be built from as written."""
        return [
            f"{component.name}: no commit pinned ({component.unpinned_reason})"
            for component in self.components.values()
            if component.commit is None
        ]


def bundles_dir(repo_root: Path) -> Path:
    return repo_root / "build" / "bundles"


def _inside(path: Path, root: Path) -> bool:
    """Whether ``path``, links followed, is under ``root`` (links followed too)."""
    return path.resolve().is_relative_to(root.resolve())


def available_bundles(repo_root: Path) -> list[str]:
    """The bundles that can be asked for: a manifest whose name is a valid bundle name (a
    hidden file or ``my bundle.toml`` is none, and is never offered as a choice)."""
    return sorted(
        path.stem
        for path in bundles_dir(repo_root).glob("*.toml")
        if NAME_PATTERN.fullmatch(path.stem)
    )


def load_bundle(repo_root: Path, name: str) -> Bundle:
    """Load ``build/bundles/<name>.toml``; an unknown name lists the valid ones."""
    valid = available_bundles(repo_root)
    if not name:
        raise UsageError(
            "no bundle given",
            fix=f"pass BUNDLE=<name> (make) or --bundle <name>; bundles: {', '.join(valid)}",
        )
    bad_name = NAME_PATTERN.fullmatch(name) is None
    if bad_name or name not in valid:
        raise UsageError(
            f"{name!r} {_BAD_NAME}" if bad_name else f"unknown bundle '{name}'",
            fix=f"use one of: {', '.join(valid) or '(none found in build/bundles)'}",
        )
    return parse_manifest(bundles_dir(repo_root) / f"{name}.toml", repo_root / "patches")


def parse_manifest(path: Path, patches_root: Path, *, bundles_root: Path | None = None) -> Bundle:
    """Read, resolve (``extends``) and validate one manifest.

    ``bundles_root`` is where parents are looked up by name (default: the manifest's
    own directory), so a manifest kept elsewhere can extend a shipped bundle.
    """
    resolved = _resolve(path, patches_root, bundles_root or path.parent, ())
    return _build_bundle(resolved, path, patches_root)


@dataclass
class _Resolved:
    """A manifest with its parents merged in, before validation."""

    data: dict[str, Any]
    digest: str
    extends: str | None
    origins: dict[str, str]
    """Patch relpath -> the bundle whose ``patches`` list put it in the series."""
    dropped: list[tuple[str, str]]
    """(patch relpath, bundle whose ``drop_patches`` took it out), in chain order."""


def _read_toml(path: Path) -> tuple[dict[str, Any], bytes]:
    text, raw = read_utf8(path, ManifestError, what="bundle manifest")
    try:
        return loads_toml(text, source=str(path), error=ManifestError), raw
    except tomllib.TOMLDecodeError as error:
        raise ManifestError(
            f"{path}: not valid TOML: {error}", fix="fix the syntax at that line"
        ) from error


def _resolve(
    path: Path, patches_root: Path, bundles_root: Path, chain: tuple[str, ...]
) -> _Resolved:
    """One manifest, parents merged in: its data, digest, parent name and patch origins."""
    data, raw = _read_toml(path)
    digest = hashlib.sha256(raw).hexdigest()
    meta = data.get("bundle")
    if not isinstance(meta, dict) or "extends" not in meta:
        return _Resolved(data, digest, None, _own_patches(data, path.stem), [])
    where = Table(data, source=str(path), error=ManifestError).table("bundle")
    parent_name: str = where.get("extends", str)
    if NAME_PATTERN.fullmatch(parent_name) is None:
        raise where.fail("extends", f"'{parent_name}' {_BAD_NAME}", "give a bundle's name")
    if parent_name == path.stem or parent_name in chain:
        loop = " -> ".join((*chain, path.stem, parent_name))
        raise where.fail(
            "extends",
            f"bundles extend each other in a loop: {loop}",
            "make one of them stand alone (give it every table and remove its extends)",
        )
    parent_path = bundles_root / f"{parent_name}.toml"
    if parent_path.exists() and not _inside(parent_path, bundles_root):
        raise where.fail(
            "extends",
            f"{parent_path} is a link to {parent_path.resolve()}, outside {bundles_root}",
            "make the parent a real file in the bundles directory",
        )
    if not parent_path.is_file():
        known = sorted(p.stem for p in bundles_root.glob("*.toml") if p != path)
        raise where.fail(
            "extends",
            f"unknown parent bundle '{parent_name}' (no {parent_path})",
            f"extend one of: {', '.join(known) or '(no bundles found)'}",
        )
    parent = _resolve(parent_path, patches_root, bundles_root, (*chain, path.stem))
    # The parent is validated on its own first, so an error in it names its own file.
    _build_bundle(parent, parent_path, patches_root)
    merged = _merge(parent.data, data)
    origins, dropped = dict(parent.origins), list(parent.dropped)
    series = _merge_series(parent.data, data, parent_name, path)
    for component, (kept, added, drops) in series.items():
        merged["components"][component]["patches"] = [*kept, *added]
        origins.update({relpath: path.stem for relpath in added})
        dropped += [(relpath, path.stem) for relpath in drops]
    return _Resolved(
        merged,
        hashlib.sha256(raw + b"\0" + parent.digest.encode()).hexdigest(),
        parent_name,
        origins,
        dropped,
    )


def _own_patches(data: Mapping[str, Any], bundle: str) -> dict[str, str]:
    """Every patch a stand-alone manifest lists, as its own (types are checked later)."""
    components = data.get("components")
    origins: dict[str, str] = {}
    if isinstance(components, dict):
        for table in components.values():
            patches = table.get("patches") if isinstance(table, dict) else None
            if isinstance(patches, list):
                origins.update({p: bundle for p in patches if isinstance(p, str)})
    return origins


def _merge_series(
    parent: Mapping[str, Any], child: Mapping[str, Any], parent_name: str, path: Path
) -> dict[str, tuple[list[str], list[str], list[str]]]:
    """Per component the child names: (the parent's patches it keeps, the ones it adds,
    the ones it drops). A drop must name a patch of the parent's series, an addition must
    not be one the series already carries."""
    root = Table(child, source=str(path), error=ManifestError)
    components = root.table("components", optional=True)
    series = {}
    for name in COMPONENT_NAMES:
        if not isinstance(components.data.get(name), dict):
            continue
        table = components.table(name)
        added: list[str] = table.get("patches", list, [], items=str)
        drops: list[str] = table.get("drop_patches", list, [], items=str)
        inherited: list[str] = parent["components"][name].get("patches", [])
        for relpath in drops:
            if relpath not in inherited:
                carried = ", ".join(f'"{p}"' for p in inherited) or "no patches"
                raise table.fail(
                    "drop_patches",
                    f"patches/{relpath} is not in the {name} series of {parent_name}, "
                    f"which carries {carried}",
                    "name the parent's patch exactly as it lists it, or remove the entry",
                )
        kept = [relpath for relpath in inherited if relpath not in drops]
        for relpath in added:
            if relpath in kept:
                raise table.fail(
                    "patches",
                    f"patches/{relpath} is already in the {name} series this bundle "
                    f"inherits from {parent_name}: a child's patches are added after its "
                    "parent's",
                    "list only the patches this bundle adds (to move an inherited one to "
                    'the end, also name it in drop_patches = ["..."])',
                )
        series[name] = (kept, added, drops)
    return series


#: A component's keys that :func:`_merge_series` merges, not :func:`_merge`.
_SERIES_KEYS = ("patches", "drop_patches")


def _merge(parent: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """Child over parent, by the rules in the module docstring. Types are checked later;
    the patch series is merged apart (:func:`_merge_series`)."""
    merged = copy.deepcopy(dict(parent))
    parent_meta = merged.get("bundle", {})
    child_meta = dict(child.get("bundle", {}))
    child_meta.pop("extends", None)
    merged["bundle"] = {"python": parent_meta["python"], **child_meta}
    for top, value in child.items():
        if top == "bundle":
            continue
        base = merged.get(top)
        if not isinstance(value, dict) or not isinstance(base, dict):
            merged[top] = copy.deepcopy(value)
        elif top == "profiles":
            merged[top] = launch_profile.merge_profiles(base, value)
        elif top == "components":
            for name, table in value.items():
                old = base.get(name)
                if isinstance(table, dict) and isinstance(old, dict):
                    if "commit" in table or "unpinned" in table:
                        old.pop("commit", None)
                        old.pop("unpinned", None)
                    pins = {k: v for k, v in table.items() if k not in _SERIES_KEYS}
                    old.update(copy.deepcopy(pins))
                else:
                    base[name] = copy.deepcopy(table)
        else:  # runtime: whole tables per package; build: key by key (same update)
            base.update(copy.deepcopy(value))
    return merged


#: Tables of a manifest that go into no wheel. Launch profiles are launch policy: the
#: environment a process starts with (``LIBTPU_INIT_ARGS``, ``XLA_FLAGS``...) is read at
#: launch, never compiled in, so changing it must not drop the wheels a lock records.
#: Runtime pins are what a host installs next to the wheels (their own record in the
#: lock, ``runtime-wheels``, is kept only while they are unchanged).
NOT_BUILD_TABLES = ("profiles", "runtime")
#: Keys of ``[bundle]`` that are prose or naming, not inputs (``extends`` is resolved).
_NOT_INPUTS = ("name", "description", "extends")


def build_digest(data: Mapping[str, Any]) -> str:
    """sha256 over what a resolved manifest puts into the wheels: Python, components,
    ``[build]`` knobs, as sorted JSON (comments, layout, the name and the description do
    not count; nor do :data:`NOT_BUILD_TABLES`). Patch contents are compared apart, by the
    lock's patch digests."""
    inputs = {key: value for key, value in data.items() if key not in NOT_BUILD_TABLES}
    meta = inputs.get("bundle")
    if isinstance(meta, Mapping):
        inputs["bundle"] = {k: v for k, v in meta.items() if k not in _NOT_INPUTS}
    blob = json.dumps(inputs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def _build_bundle(resolved: _Resolved, path: Path, patches_root: Path) -> Bundle:
    data, extends = resolved.data, resolved.extends
    root = Table(data, source=str(path), error=ManifestError)
    root.check_keys({"bundle", "components", "runtime", "build", "profiles"})

    meta = root.table("bundle")
    fields = meta.read(
        Field("name", str, required=True),
        Field("python", str, required=True),
        Field("description", str, default=""),
        Field("extends", str),
    )
    name, python = fields["name"], fields["python"]
    if NAME_PATTERN.fullmatch(name) is None:
        raise meta.fail(
            "name",
            f"'{name}' {_BAD_NAME}",
            'rename the bundle and its file, e.g. name = "v6e-2.11" in v6e-2.11.toml',
        )
    if name != path.stem:
        raise meta.fail(
            "name",
            f"is '{name}' but the file is {path.name}",
            f'set name = "{path.stem}" or rename the file to {name}.toml',
        )
    if not _PYTHON.fullmatch(python):
        raise meta.fail(
            "python", f"'{python}' is not a Python 3 minor version", 'write e.g. "3.13"'
        )

    components_table = root.table("components")
    components_table.check_keys(COMPONENT_NAMES)
    components = {
        component: _parse_component(
            components_table.table(component), component, patches_root, resolved, path.stem
        )
        for component in COMPONENT_NAMES
    }
    _reject_duplicate_patches(components, path)

    root.table("runtime", optional=True).check_keys(RUNTIME_NAMES)
    runtime = {
        package: _parse_runtime(table, package) for package, table in root.tables("runtime").items()
    }

    knobs = root.table("build", optional=True).read(
        Field("bundle_libtpu", bool, default=False),
        Field("tpuvm_mode", bool, default=True),
        Field("build_cpp_tests", bool, default=False),
        Field("cxx_abi", int, default=1),
    )
    if knobs["cxx_abi"] not in (0, 1):
        raise root.table("build").fail(
            "cxx_abi", f"must be 0 or 1, got {knobs['cxx_abi']}", "PyTorch 2.9+ wheels use 1"
        )
    return Bundle(
        name=name,
        path=path,
        description=fields["description"],
        python=python,
        components=components,
        runtime=runtime,
        build=BuildKnobs(**knobs),
        manifest_sha256=resolved.digest,
        extends=extends,
        profiles=launch_profile.parse_profiles(data.get("profiles", {}), path),
        build_sha256=build_digest(data),
    )


def _parse_component(
    table: Table, name: str, patches_root: Path, resolved: _Resolved, bundle: str
) -> Component:
    fields = table.read(
        Field("remote", str, required=True),
        Field("commit", str),
        Field("unpinned", str),
        Field("version", str),
        Field("submodules", bool, default=name == "torch"),
        Field("patches", list, default=[], items=str),
        Field("drop_patches", list, items=str),
    )
    if fields["drop_patches"] is not None:
        # A child's drop_patches is consumed by the merge; here it is a stand-alone's.
        raise table.fail(
            "drop_patches",
            "this bundle extends no other: there is no inherited patch to drop",
            "remove drop_patches and list in patches only the patches the series carries",
        )
    commit, unpinned, version = fields["commit"], fields["unpinned"], fields["version"]
    if commit is None and unpinned is None:
        raise table.fail(
            "commit",
            "missing",
            "pin a commit (full 40-hex SHA, or a short one of at least 7 hex digits), or say "
            'why it is not known yet with unpinned = "<reason>"',
        )
    if commit is not None and unpinned is not None:
        raise table.fail("unpinned", "given together with 'commit'", "keep only one of them")
    if commit is not None and (
        not _HEX.fullmatch(commit) or not _MIN_SHORT_SHA <= len(commit) <= 40
    ):
        raise table.fail(
            "commit",
            f"'{commit}' is not a git commit SHA",
            "write 7 to 40 lowercase hex digits (a full 40-digit SHA is best)",
        )
    if version is not None and not _VERSION.fullmatch(version):
        raise table.fail(
            "version",
            f"'{version}' is not a public version",
            'write e.g. "2.9.0" or "2.11.0a0" (the local label is added by the build)',
        )
    if name != "openxla" and version is None:
        raise table.fail("version", "missing", f'{name} wheels need a version, e.g. "2.9.0"')
    patches = _parse_patches(table, name, fields["patches"], patches_root, resolved, bundle)
    remote = fields["remote"]
    try:
        check_remote(remote)
    except BadValue as bad:
        raise table.fail(
            "remote",
            f"{remote!r} {bad.reason}" if remote.strip() else bad.reason,
            f"write the git URL or path of {name}: {REMOTE_RULE}, "
            f'e.g. "{UPSTREAM_REMOTES[name]}"',
        ) from None
    return Component(
        name=name,
        remote=remote,
        commit=commit,
        unpinned_reason=unpinned,
        version=version,
        submodules=fields["submodules"],
        patches=patches,
        dropped=tuple(
            (relpath, by)
            for relpath, by in resolved.dropped
            # A patch dropped and listed again (moved to the end) is in the series.
            if PurePosixPath(relpath).parts[0] == name and relpath not in fields["patches"]
        ),
    )


def _parse_patches(
    table: Table,
    name: str,
    relpaths: list[str],
    patches_root: Path,
    resolved: _Resolved,
    bundle: str,
) -> tuple[PatchRef, ...]:
    """The series as listed (inherited patches merged in): each a real patch file inside
    ``patches/``, with the bundle that lists it."""
    patches = []
    origins = [resolved.origins.get(relpath, bundle) for relpath in relpaths]
    inherited = len(origins) - origins.count(bundle)  # the parent's come first
    for index, (relpath, origin) in enumerate(zip(relpaths, origins, strict=True)):
        # An error names the entry as this bundle's own list numbers it (the parent's
        # entries were checked with the parent).
        _check_patch_path(table, name, index - inherited, relpath)
        patch_path = patches_root / relpath
        if patch_path.is_dir():
            raise table.fail(
                "patches",
                f"patches/{relpath} is a directory, not a patch file",
                "list the patch files inside it, one entry each",
            )
        if not _inside(patch_path, patches_root):
            # A symlink is judged by its target: the series must come from the project.
            raise table.fail(
                "patches",
                f"patches/{relpath} is a link to {patch_path.resolve()}, outside patches/",
                "copy the patch into patches/ (a real file) and list it there",
            )
        _check_patch_file(table, relpath, patch_path)
        patches.append(PatchRef(relpath=relpath, path=patch_path, bundle=origin))
    return tuple(patches)


def _check_patch_file(table: Table, relpath: str, path: Path) -> None:
    """The listed patch is a regular file: a FIFO or device is refused from its stat (never
    opened: reading a FIFO waits forever), a missing one is named as missing."""

    def refused(message: str, fix: str) -> Exception:
        return table.fail("patches", message.replace(str(path), f"patches/{relpath}"), fix)

    try:
        check_regular(path, refused, what="patch file")
    except FileNotFoundError:
        raise table.fail(
            "patches",
            f"patch file patches/{relpath} does not exist",
            "fix the path (relative to patches/) or add the file",
        ) from None


def _check_patch_path(table: Table, component: str, index: int, relpath: str) -> None:
    """A patch is named one way only: ``<component>/<file>`` under ``patches/``.

    One spelling per file keeps the lock's paths and the duplicate check honest
    (``./torch_xla/x.patch`` is the same file as ``torch_xla/x.patch``), keeps the series
    inside the project (no absolute or ``..`` paths), and keeps each component's patches
    in its own directory, which is where ``make patch-export`` writes them back.
    """
    pure = PurePosixPath(relpath)
    if not relpath or "\\" in relpath or pure.is_absolute() or ".." in pure.parts:
        raise table.fail(
            "patches",
            f"entry {index} '{relpath}' is not a path inside patches/",
            f'list it relative to patches/, e.g. "{component}/0001-name.patch"',
        )
    canonical = posixpath.normpath(relpath)
    if canonical != relpath:
        raise table.fail(
            "patches",
            f"entry {index} '{relpath}' is not written the one way a patch is named",
            f'write "{canonical}"',
        )
    if pure.parts[0] != component or len(pure.parts) != 2:
        raise table.fail(
            "patches",
            f"entry {index} '{relpath}' is not in patches/{component}/, the directory of "
            f"the {component} series",
            f"move the file to patches/{component}/ and list it as "
            f'"{component}/{pure.name}" (or list it under the component it patches)',
        )


def _reject_duplicate_patches(components: Mapping[str, Component], path: Path) -> None:
    seen: dict[str, str] = {}
    for component in components.values():
        for patch in component.patches:
            if patch.relpath in seen:
                raise ManifestError(
                    f"{path}: key 'components.{component.name}.patches': "
                    f"patches/{patch.relpath} is listed twice "
                    f"(also in components.{seen[patch.relpath]}.patches)",
                    fix="list each patch file once",
                )
            seen[patch.relpath] = component.name


def _parse_runtime(table: Table, name: str) -> RuntimePin:
    pins = table.read(Field("version", str), Field("minimum", str), Field("preferred", str))
    version, minimum, preferred = pins["version"], pins["minimum"], pins["preferred"]
    if version is None and minimum is None:
        raise table.fail("version", "missing", 'give version = "X" or minimum = "X"')
    if version is not None and (minimum or preferred):
        raise table.fail("version", "given with minimum/preferred", "an exact pin stands alone")
    for key, value in pins.items():
        if value is not None and not _VERSION.fullmatch(value):
            raise table.fail(key, f"'{value}' is not a version", 'write e.g. "0.0.36"')
    return RuntimePin(name=name, version=version, minimum=minimum, preferred=preferred)


def describe(bundle: Bundle) -> str:
    """The block ``make bundles`` prints for one bundle."""
    lines = [f"{bundle.name}: {bundle.description}".rstrip(": "), f"  python    {bundle.python}"]
    for component in bundle.components.values():
        commit_text = component.commit or f"UNPINNED ({component.unpinned_reason})"
        version = f" version {component.version}" if component.version else ""
        lines.append(f"  {component.name:<9} {commit_text}{version}")
        lines += [f"              {line}" for line in series_lines(component)]
    for pin in bundle.runtime.values():
        lines.append(f"  {pin.name:<9} {_pin_text(pin)}")
    for profile in bundle.profiles.values():
        lines.append(f"  profile   {profile.name} sha256:{profile.sha256[:12]}")
    return "\n".join(lines)


def diff(left: Bundle, right: Bundle) -> list[tuple[str, str, str]]:
    """(field, left value, right value) for every pin that differs."""
    rows: list[tuple[str, str, str]] = []

    def compare(field: str, a: object, b: object) -> None:
        if a != b:
            rows.append((field, _show(a), _show(b)))

    compare("python", left.python, right.python)
    for name in COMPONENT_NAMES:
        a, b = left.components[name], right.components[name]
        compare(f"{name}.commit", a.commit or "unpinned", b.commit or "unpinned")
        compare(f"{name}.remote", a.remote, b.remote)
        compare(f"{name}.version", a.version, b.version)
        # The series is compared by its files in order; where each comes from is shown.
        if [p.relpath for p in a.patches] != [p.relpath for p in b.patches]:
            rows.append((f"{name}.patches", _series_text(a), _series_text(b)))
    for name in sorted(set(left.runtime) | set(right.runtime)):
        compare(
            f"runtime.{name}", _pin_text(left.runtime.get(name)), _pin_text(right.runtime.get(name))
        )
    compare("build", left.build, right.build)
    rows += launch_profile.diff_rows(left.profiles, right.profiles)
    return rows


def series_lines(component: Component) -> list[str]:
    """The effective series, one line per patch in the order it is applied, each with the
    bundle that lists it; then each inherited patch left out, with the bundle that drops it."""
    lines = [f"+ patches/{patch.relpath}  (from {patch.bundle})" for patch in component.patches]
    lines += [f"- patches/{relpath}  (dropped by {by})" for relpath, by in component.dropped]
    return lines


def series_changes(left: Bundle, right: Bundle) -> list[str]:
    """What ``make diff`` prints under its rows: for each component whose series differs,
    ``right``'s effective series with where each patch comes from, and what it drops."""
    lines: list[str] = []
    for name in COMPONENT_NAMES:
        a, b = left.components[name], right.components[name]
        if [p.relpath for p in a.patches] == [p.relpath for p in b.patches]:
            continue
        lines.append(f"{name} series of {right.name} ({len(b.patches)} patch(es), in order):")
        lines += [f"  {line}" for line in series_lines(b)]
    return lines


def restore_patches_fix(bundle: Bundle, component: str, relpaths: Iterable[str]) -> str:
    """How to put each of ``relpaths`` back into ``bundle``'s ``component`` series: out of
    the ``drop_patches`` that took it out, else into a ``patches`` list."""
    dropped_by = dict(bundle.components[component].dropped)
    steps = []
    for relpath in relpaths:
        if relpath in dropped_by:
            steps.append(
                f'remove "{relpath}" from [components.{component}] drop_patches in '
                f"build/bundles/{dropped_by[relpath]}.toml"
            )
        else:
            steps.append(
                f'list "{relpath}" in [components.{component}] patches of '
                f"build/bundles/{bundle.name}.toml, in its place in the series (by number)"
            )
    return "; ".join(steps) + f", then run `make patches-check BUNDLE={bundle.name}` again"


def _series_text(component: Component) -> str:
    if not component.patches:
        return "(none)"
    # By origin, in order: "5 from v6e-2.11, 1 from team".
    runs = groupby(component.patches, key=lambda patch: patch.bundle)
    return ", ".join(f"{len(list(run))} from {origin}" for origin, run in runs)


def _pin_text(pin: RuntimePin | None) -> str:
    if pin is None:
        return "-"
    return pin.specifier + (f" (preferred {pin.preferred})" if pin.preferred else "")


def _show(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "(none)"
    return str(value)
