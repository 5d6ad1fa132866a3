"""Where a torch / torch_xla pair comes from, and the check of one pair.

Three sources, one shape (:class:`PairFiles`: the ``_XLAC`` extension and torch's
``lib/`` directory on disk):

- an installed environment, found by asking its interpreter for the two distributions'
  file lists (``importlib.metadata``) without importing torch or torch_xla;
- two wheel files: only ``_XLAC*.so`` and the ``torch/lib/`` libraries it needs are
  extracted (zipfile) into a directory the caller owns;
- a bundle's locked wheels: ``wheels.lock`` names them, ``dist/<bundle>/`` holds them,
  and their sha256 must match (``publish.wheels.locked_wheels``).
"""

from __future__ import annotations

import re
import shutil
import zipfile
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xla_host import runner
from xla_host.errors import ExitCode, PipelineError
from xla_host.installed_metadata import InstalledDistribution, ProbeFailed, read_installed
from xla_host.wheel_filename import WheelFilenameError, parse_wheel_name
from xla_wheels.abi.compare import Comparison, SymbolGroup, compare, group_missing
from xla_wheels.abi.elf import SharedObject, read_shared_object

#: torch_xla's extension module: ``_XLAC.<abi tag>.so`` at the top of the wheel/site-packages.
EXTENSION = re.compile(r"^_XLAC\.[^/]*\.so$")
#: Library names torch ships in ``torch/lib`` (a DT_NEEDED entry matching this that torch
#: does not have fails the import with "cannot open shared object file").
TORCH_LIBRARY = re.compile(r"^lib(c10|torch|shm|caffe2)[A-Za-z0-9_]*\.so(\.[0-9]+)*$")
TORCH_LIB_DIR = "torch/lib"


class AbiInputError(PipelineError):
    """The pair cannot be read (missing file, not a wheel, no torch in the environment)."""

    exit_code = ExitCode.BAD_INPUT


class NoExtension(AbiInputError):
    """The torch_xla side has no ``_XLAC`` extension: the check does not apply."""


class AbiMismatch(PipelineError):
    """``_XLAC`` imports symbols (or libraries) the paired torch does not have."""

    exit_code = ExitCode.FAILED


@dataclass(frozen=True)
class PairFiles:
    extension: Path
    torch_lib_dir: Path
    torch_label: str
    torch_xla_label: str


@dataclass(frozen=True)
class AbiResult:
    files: PairFiles
    comparison: Comparison
    missing_libraries: tuple[str, ...]
    groups: tuple[SymbolGroup, ...]
    demangled: bool

    @property
    def ok(self) -> bool:
        return self.comparison.ok and not self.missing_libraries


def _expand(entry: str, origin: Path) -> Path:
    """An RPATH/RUNPATH entry with ``$ORIGIN`` (the object's own directory) filled in."""
    return Path(entry.replace("${ORIGIN}", str(origin)).replace("$ORIGIN", str(origin)))


def load_order(extension: SharedObject, torch_lib_dir: Path) -> tuple[list[SharedObject], set[str]]:
    """The libraries the loader maps for ``extension``, breadth first, as ``ld.so`` does:
    each DT_NEEDED once, found through the needing object's DT_RUNPATH, or without one
    through its DT_RPATH and its loaders' (``$ORIGIN`` filled in), then torch's ``lib/``.

    Only libraries inside the environment the pair lives in are read: the site-packages
    holding torch and the extension's own directory (``nvidia/*/lib`` reached by
    ``$ORIGIN/../../nvidia/...`` included). System libraries (libc, libstdc++) are not:
    references versioned against them are theirs (:mod:`xla_wheels.abi.compare`). Returns
    the libraries in load order, read without their symbols (``with_symbols=False``), and
    the names of the extension's own DT_NEEDED found."""
    roots = [torch_lib_dir.resolve().parent.parent, extension.path.resolve().parent]
    seen: set[str] = set()
    direct: set[str] = set()
    loaded: list[SharedObject] = []
    # (object, the DT_RPATH directories of the objects that loaded it)
    queue: deque[tuple[SharedObject, tuple[Path, ...]]] = deque([(extension, ())])
    while queue:
        current, inherited = queue.popleft()
        origin = current.path.resolve().parent
        own = tuple(_expand(e, origin) for e in current.rpath)
        if current.runpath:
            dirs = [_expand(e, origin) for e in current.runpath]
            passed_on: tuple[Path, ...] = ()  # a RUNPATH ends the chain of RPATHs
        else:
            dirs = [*own, *inherited]
            passed_on = (*own, *inherited)
        for name in current.needed:
            if name in seen:
                continue
            for directory in (*dirs, torch_lib_dir):
                path = (directory / name).resolve()
                if path.is_file() and any(path.is_relative_to(root) for root in roots):
                    break
            else:
                continue
            seen.add(name)
            if current is extension:
                direct.add(name)
            library = read_shared_object(path, with_symbols=False)
            loaded.append(library)
            queue.append((library, passed_on))
    return loaded, direct


def check_pair(files: PairFiles) -> AbiResult:
    """Read the extension and every library it loads from the environment (transitively,
    :func:`load_order`), compare, demangle, group."""
    extension = read_shared_object(files.extension)
    order, present = load_order(extension, files.torch_lib_dir)
    absent = tuple(n for n in extension.needed if TORCH_LIBRARY.match(n) and n not in present)
    # Symbols are read library by library in load order, and the reading stops once every
    # reference binds: a library later in the order cannot unbind one. A CUDA torch's
    # nvidia libraries come last and are read only when a symbol is still missing.
    mapped = [linked.name for linked in order]
    libraries: list[SharedObject] = []
    comparison = compare(extension, libraries, mapped)
    for linked in order:
        if comparison.ok:
            break
        libraries.append(read_shared_object(linked.path))
        comparison = compare(extension, libraries, mapped)
    readable = demangle([symbol.name for symbol in comparison.missing])
    return AbiResult(
        files=files,
        comparison=comparison,
        missing_libraries=absent,
        groups=group_missing(comparison.missing, readable, libraries),
        demangled=shutil.which("c++filt") is not None,
    )


def demangle(names: Sequence[str]) -> dict[str, str]:
    """mangled -> demangled for each name, by one ``c++filt`` (binutils) for all of them;
    itself when c++filt is absent or fails.

    Only what is printed changes: the comparison works on mangled names, which are what
    the dynamic linker reports.
    """
    program = shutil.which("c++filt")
    if program is None or not names:
        return {name: name for name in names}
    try:
        result = runner.run(
            [program], echo="none", input_text="\n".join(names) + "\n", timeout=120, check=False
        )
    except (OSError, runner.StepTimedOut):
        return {name: name for name in names}
    lines = result.stdout.splitlines()
    if result.returncode != 0 or len(lines) != len(names):
        return {name: name for name in names}
    return dict(zip(names, lines, strict=True))


def render(result: AbiResult) -> str:
    comparison = result.comparison
    lines = [
        f"abi-check: {result.files.torch_xla_label} against {result.files.torch_label}",
        f"  extension  {result.files.extension}",
        f"  torch libs {result.files.torch_lib_dir}: " + ", ".join(comparison.torch_libraries),
        f"  {comparison.checked} strong imports owed by torch checked; "
        + ", ".join(f"{count} to {provider}" for provider, count in comparison.elsewhere)
        + f"; {comparison.weak_ignored} weak imports ignored",
    ]
    for name in result.missing_libraries:
        lines.append(f"  MISSING LIBRARY {name}: _XLAC needs it, torch's lib/ does not have it")
    if comparison.missing:
        lines.append(
            f"  MISSING {len(comparison.missing)} symbol(s) that _XLAC imports and this torch "
            "does not export (ImportError: undefined symbol at `import torch_xla`):"
        )
        for group in result.groups:
            lines.append(f"    {group.library} · {group.scope} ({len(group.symbols)})")
            for readable, mangled in group.symbols:
                lines.append(f"      {readable}")
                if readable != mangled:
                    lines.append(f"        {mangled}")
        if not result.demangled:
            lines.append("  (names are mangled: install binutils for c++filt)")
    if result.ok:
        lines.append("  ok: every symbol and library _XLAC needs from torch is there")
    return "\n".join(lines)


def ensure_compatible(result: AbiResult) -> None:
    if result.ok:
        return
    problems = [f"library {name}" for name in result.missing_libraries]
    problems += [readable for group in result.groups for readable, _ in group.symbols]
    raise AbiMismatch(
        f"{result.files.torch_xla_label} does not fit {result.files.torch_label}: "
        f"{len(problems)} missing: " + "; ".join(problems),
        fix="install the torch that this torch_xla was built against (torch_xla pins it "
        "exactly), or rebuild torch_xla against this torch",
    )


# --- an installed environment ----------------------------------------------------------


def from_python(python: str) -> PairFiles:
    """The pair installed in ``python``'s environment, found without importing it."""
    fix = "pass PYTHON=<the python of the environment with torch and torch_xla>"
    try:
        found = read_installed(python, (), with_files=("torch", "torch_xla"), isolated=True)
    except ProbeFailed as error:
        raise AbiInputError(error.message, fix=fix) from None
    if found.imported:
        raise AbiInputError(
            f"{python} imported {list(found.imported)} at startup (a site hook?)",
            fix="remove the hook that imports torch at interpreter start",
        )
    torch_xla, torch = found.dists.get("torch_xla"), found.dists.get("torch")
    if torch_xla is None:
        raise NoExtension(
            f"not applicable: torch_xla is not installed in {python}",
            fix="install torch_xla there, or pass the PYTHON of the training environment",
        )
    extensions = [f for f in torch_xla.files if EXTENSION.match(Path(f).name)]
    if not extensions:
        raise NoExtension(
            f"not applicable: no _XLAC extension in torch_xla {torch_xla.version} "
            f"installed in {python}",
            fix="reinstall torch_xla from a Linux wheel",
        )
    lib_dir = None if torch is None else _torch_lib_dir(torch)
    if torch is None or lib_dir is None:
        raise AbiInputError(
            f"torch is not installed in {python}: _XLAC's torch libraries are missing",
            fix="install the torch that torch_xla pins (pip install torch==<torch_xla's>)",
        )
    return PairFiles(
        extension=Path(torch_xla.site) / extensions[-1],
        torch_lib_dir=lib_dir,
        torch_label=f"torch {torch.version} ({found.python})",
        torch_xla_label=f"torch_xla {torch_xla.version}",
    )


def _torch_lib_dir(torch: InstalledDistribution) -> Path | None:
    """The directory of torch's ``libc10.so``: from its RECORD, else next to the package."""
    for listed in reversed(torch.files):
        path = Path(torch.site) / listed
        if path.name == "libc10.so" and path.parent.name == "lib":
            return path.parent
    return None if torch.package_dir is None else Path(torch.package_dir) / "lib"


# --- two wheel files ------------------------------------------------------------------


def _open_wheel(path: Path, what: str) -> zipfile.ZipFile:
    if not path.is_file():
        raise AbiInputError(
            f"{what} wheel {path} does not exist",
            fix=f"pass the path of a {what} .whl file",
        )
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise AbiInputError(
            f"{path} is not a wheel (zip) file: {error}",
            fix=f"pass a {what} .whl file as downloaded or built",
        ) from None


def _label(wheel: Path, project: str) -> str:
    try:
        version = parse_wheel_name(wheel.name).version
    except WheelFilenameError:
        version = "?"  # a label only: the check judges the files, not their names
    return f"{project} {version} ({wheel.name})"


def from_wheels(torch_wheel: Path, torch_xla_wheel: Path, workdir: Path) -> PairFiles:
    """Extract ``_XLAC*.so`` and the libraries it needs that ``torch/lib/`` has from two
    wheels into ``workdir`` (the caller's); both are opened before anything is extracted."""
    with (
        _open_wheel(torch_wheel, "torch") as torch,
        _open_wheel(torch_xla_wheel, "torch_xla") as torch_xla,
    ):
        extensions = [name for name in torch_xla.namelist() if EXTENSION.match(name)]
        if not extensions:
            raise NoExtension(
                f"not applicable: no _XLAC extension in {torch_xla_wheel.name}",
                fix="pass a torch_xla wheel built for Linux (it carries _XLAC.<abi>.so)",
            )
        extension = Path(torch_xla.extract(extensions[0], workdir / "torch_xla"))
        members = set(torch.namelist())
        if f"{TORCH_LIB_DIR}/libc10.so" not in members:
            raise AbiInputError(
                f"{torch_wheel.name} has no {TORCH_LIB_DIR}/libc10.so: not a Linux torch wheel",
                fix="pass a torch wheel for Linux (TORCH_WHEEL=torch-...-linux_x86_64.whl)",
            )
        for name in read_shared_object(extension).needed:
            if f"{TORCH_LIB_DIR}/{name}" in members:
                torch.extract(f"{TORCH_LIB_DIR}/{name}", workdir / "torch")
    return PairFiles(
        extension=extension,
        torch_lib_dir=workdir / "torch" / TORCH_LIB_DIR,
        torch_label=_label(torch_wheel, "torch"),
        torch_xla_label=_label(torch_xla_wheel, "torch_xla"),
    )


def pick_pair(wheels: list[Path], where: str) -> tuple[Path, Path]:
    """(torch wheel, torch_xla wheel) among a set of wheels (a bundle's, the staged ones)."""
    by_project: dict[str, list[Path]] = {}
    for wheel in wheels:
        by_project.setdefault(parse_wheel_name(wheel.name).normalized, []).append(wheel)
    torch, torch_xla = by_project.get("torch", []), by_project.get("torch-xla", [])
    if len(torch) != 1 or len(torch_xla) != 1:
        raise AbiInputError(
            f"{where} must hold exactly one torch and one torch_xla wheel, found "
            f"{len(torch)} and {len(torch_xla)}",
            fix="build the bundle (`make wheels BUNDLE=...`) or pass TORCH_WHEEL= and "
            "TORCH_XLA_WHEEL=",
        )
    return torch[0], torch_xla[0]
