"""``series-compile``: every translation unit the series touches, compiled base and patched.

The compiled checks (:mod:`.run`) build functions taken out of the tree against stand-ins;
this compiles the tree's own translation units with g++ against real XLA, torch and LLVM
headers (:mod:`.xla_headers`), at the series' base and with the series applied, and
compares what g++ says. Which units: the ``.cpp`` files the series changes, and every
``.cpp`` that includes a header it changes, directly or through other headers of the tree
(:func:`touched_units`, from ``git diff`` and the tree's include graph, never a hand list).

An error is keyed on its file, the text of the line it points at and g++'s message
(:class:`UnitError`), not its line number: a patch that moves code does not make the base's
errors new. An error of the patched tree that the base does not have is the series'
(:class:`NewError`), traced to the patch that wrote its line with ``git blame``.

Headers the header set lacks (the distributed runtime, IFRT, the profiler's Python
wrapper, torch_xla's generated code) get generated stand-ins (:func:`stand_in_text`):
empty, or forward declarations of the classes torch_xla's headers name. Every error they
cause is in base and patched alike, so they hide nothing the series adds except inside
code that uses them, which is why the report names them.

What one unit's errors are is cached per machine by content (``<cache>/series-compile/
errors/``): the key is the compiler, the flags, the header set and the bytes of every file
of the tree the unit includes, so a second run with the same trees compiles nothing, and a
changed patch recompiles only the units that include what it changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from xla_host import filemode, log, runner
from xla_host.errors import ToolchainError
from xla_wheels.gitutil import git
from xla_wheels.series_checks.codegen import generate_code
from xla_wheels.series_checks.xla_headers import SUBDIR, Headers

#: Where the tree's C++ lives, and what a translation unit is.
SOURCE_ROOT = "torch_xla/csrc"
UNIT_SUFFIXES = (".cpp", ".cc")
HEADER_SUFFIXES = (".h", ".hpp")
COMPILE_TIMEOUT_S = 1200.0
STAND_INS = "stand-ins"
ERRORS_SUBDIR = "errors"
#: g++ 12.2's flags for torch_xla's sources (from its Bazel build: C++17, exceptions,
#: OpenMP, the torch extension's defines, the new C++ ABI torch 2.9 is built with).
FLAGS = (
    "-std=c++17",
    "-fsyntax-only",
    "-fexceptions",
    "-fopenmp",
    "-fPIC",
    "-fwrapv",
    "-w",  # warnings are not findings; the headers' own would drown the errors
    "-fdiagnostics-color=never",
    "-fno-diagnostics-show-caret",
    "-ftemplate-backtrace-limit=1",
    "-DTORCH_API_INCLUDE_EXTENSION_H",
    "-DTORCH_EXTENSION_NAME=_XLAC",
    "-D_GLIBCXX_USE_CXX11_ABI=1",
)
#: Forward declarations a stand-in gives, for the headers whose classes torch_xla's own
#: headers hold by pointer (the coordinator's members): with them those headers compile.
FORWARD_DECLARATIONS: dict[str, str] = {
    "xla/pjrt/distributed/distributed.h": (
        "namespace xla {\nclass DistributedRuntimeClient;\nclass DistributedRuntimeService;\n"
        "class CoordinationServiceImpl;\n}  // namespace xla\n"
    ),
    "xla/tsl/distributed_runtime/preemption/preemption_sync_manager.h": (
        "namespace tsl {\nclass PreemptionSyncManager;\n}  // namespace tsl\n"
    ),
}
#: What this command does not prove: printed with every report (and in docs/patches.md).
NOT_PROVEN = (
    "not the pinned OpenXLA itself (the headers of a published TensorFlow's XLA)",
    "g++, not upstream's clang 17",
    "code behind stand-in headers is not checked",
    "nothing is linked",
    "Bazel's BUILD dependencies are not checked",
)

_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](?P<path>[^">]+)[">]', re.MULTILINE)
_DIAGNOSTIC = re.compile(
    r"^(?P<path>[^:\s][^:]*):(?P<line>\d+):(?:\d+:)? (?P<fatal>fatal )?error: (?P<message>.*)$"
)


@dataclass(frozen=True)
class UnitError:
    """One g++ error, as compared between the trees: where (file and the text of the line,
    not its number) and what."""

    path: str
    """Relative to the tree; ``<headers>/...`` or ``<stand-in>/...`` outside it."""
    text: str
    message: str
    line: int
    """Where it is in this tree (for the report and ``git blame``; not compared)."""
    fatal: bool = False
    """g++ stopped here (a header it cannot find): the rest of the unit was not compiled."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.path, self.text, self.message)


@dataclass(frozen=True)
class UnitResult:
    unit: str
    errors: tuple[UnitError, ...]
    cached: bool
    timed_out: bool = False

    @property
    def stopped(self) -> UnitError | None:
        """The fatal error that ended the compile early, if one did."""
        return next((error for error in self.errors if error.fatal), None)


@dataclass(frozen=True)
class NewError:
    """An error the patched tree has and the base does not, with the patch behind it."""

    unit: str
    error: UnitError
    patch: str | None

    def render(self) -> str:
        owner = f"patches/{self.patch}" if self.patch else "(a line no patch wrote)"
        return f"{owner}: {self.error.path}:{self.error.line}: {self.error.message}"


@dataclass(frozen=True)
class SeriesCompileReport:
    units: tuple[str, ...]
    base: tuple[UnitResult, ...]
    patched: tuple[UnitResult, ...]
    new_errors: tuple[NewError, ...]
    stand_ins: tuple[str, ...]
    headers: Headers

    @property
    def not_compiled(self) -> list[UnitResult]:
        """Units g++ did not compile through, in either tree: nothing is proven of them."""
        return [r for r in (*self.base, *self.patched) if r.timed_out or r.stopped]

    @property
    def passed(self) -> bool:
        return not self.new_errors and not self.not_compiled

    def lines(self) -> list[str]:
        lines = []
        for base, patched in zip(self.base, self.patched, strict=True):
            added = sum(1 for e in self.new_errors if e.unit == patched.unit)
            stopped = next((r for r in (base, patched) if r.timed_out or r.stopped), None)
            if stopped is not None:
                fatal = stopped.stopped
                why = (
                    f"{fatal.path}:{fatal.line}: {fatal.message}"
                    if fatal
                    else f"did not finish in {COMPILE_TIMEOUT_S:.0f}s"
                )
                lines.append(f"NOT CHECKED {patched.unit}: g++ did not get through it ({why})")
                continue
            state = "FAIL" if added else "ok  "
            cached = " (cached)" if base.cached and patched.cached else ""
            lines.append(
                f"{state} {patched.unit}: {len(base.errors)} error(s) at base, "
                f"{len(patched.errors)} patched, {added} new{cached}"
            )
        lines.extend(f"  {error.render()}" for error in self.new_errors)
        if self.stand_ins:
            lines.append(f"stand-in headers (code using them is not checked): "
                         f"{', '.join(self.stand_ins)}")  # fmt: skip
        lines.append(f"headers: {self.headers.header_set.name} ({self.headers.header_set.note})")
        lines.append("not proven: " + "; ".join(NOT_PROVEN))
        return lines


# --- which units ----------------------------------------------------------------------------


def include_graph(tree: Path, generated: Path | None = None) -> dict[str, tuple[str, ...]]:
    """Each C++ file under :data:`SOURCE_ROOT` (of the tree, and of ``generated``, the
    codegen's output) -> the files of the tree it includes."""
    roots = [tree] if generated is None else [tree, generated]
    files = sorted({
        p.relative_to(root).as_posix()
        for root in roots
        for p in (root / SOURCE_ROOT).rglob("*")
        if p.suffix in UNIT_SUFFIXES + HEADER_SUFFIXES and p.is_file()
    })  # fmt: skip
    known = set(files)
    graph = {}
    for name in files:
        text = source_path(tree, generated, name).read_text(encoding="utf-8", errors="replace")
        graph[name] = tuple(
            resolved
            for include in _INCLUDE.findall(text)
            if (resolved := _resolve(include, name, known)) is not None
        )
    return graph


def source_path(tree: Path, generated: Path | None, name: str) -> Path:
    """Where file ``name`` of the compiled tree is: the tree's, else the codegen's."""
    if generated is not None and not (tree / name).exists():
        return generated / name
    return tree / name


def _resolve(include: str, includer: str, known: set[str]) -> str | None:
    for candidate in (include, os.path.normpath(f"{os.path.dirname(includer)}/{include}")):
        if candidate in known:
            return candidate
    return None


def closure(unit: str, graph: Mapping[str, Sequence[str]]) -> list[str]:
    """``unit`` and every tree file it includes, directly or not, sorted."""
    seen = {unit}
    stack = [unit]
    while stack:
        for included in graph.get(stack.pop(), ()):
            if included not in seen:
                seen.add(included)
                stack.append(included)
    return sorted(seen)


def changed_files(tree: Path, base: str) -> list[str]:
    """What the series changes: the files of ``base..HEAD`` in ``tree``."""
    done = git(["diff", "--name-only", "--no-renames", base, "HEAD"], cwd=tree)
    return sorted(line for line in done.stdout.splitlines() if line)


def touched_units(tree: Path, changed: Iterable[str]) -> list[str]:
    """The units of ``tree`` that are in ``changed`` or include a file in it."""
    graph = include_graph(tree)
    changed = set(changed)
    return [
        name
        for name in graph
        if name.endswith(UNIT_SUFFIXES) and changed.intersection(closure(name, graph))
    ]


# --- stand-ins ------------------------------------------------------------------------------


def missing_includes(
    tree: Path, files: Iterable[str], headers: Headers, graph: Mapping[str, Sequence[str]],
    generated: Path | None = None,
) -> list[str]:  # fmt: skip
    """Includes of ``files`` (tree-relative) found neither in the tree, the codegen's
    output nor the headers."""
    missing = set()
    for name in files:
        text = source_path(tree, generated, name).read_text(encoding="utf-8", errors="replace")
        for include in _INCLUDE.findall(text):
            if _resolve(include, name, set(graph)) is not None or (tree / include).exists():
                continue
            if any((d / include).exists() for d in headers.include_dirs):
                continue
            if "/" in include:  # <vector>, <pybind11/...> and the like are the system's
                missing.add(include)
    return sorted(m for m in missing if m.startswith(("xla/", "tsl/", "torch_xla/")))


def stand_in_text(include: str) -> str:
    declarations = FORWARD_DECLARATIONS.get(include, "")
    return (
        f"// Stand-in for {include}, which the header set does not ship (series-compile).\n"
        f"#pragma once\n{declarations}"
    )


def write_stand_ins(directory: Path, includes: Iterable[str]) -> None:
    for include in includes:
        target = directory / include
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(stand_in_text(include), encoding="utf-8")


# --- compiling one unit ---------------------------------------------------------------------


def compile_argv(
    unit: str, headers: Headers, stand_ins: Path, compiler: str, generated: Path | None = None
) -> list[str]:
    include = ["-I.", *([f"-I{generated}"] if generated else []), f"-I{stand_ins}"]
    # CPython's headers, which torch's Python API and pybind11 include: this interpreter's
    # (the torch wheel's headers are for the same CPython ABI family).
    for directory in (*headers.include_dirs, Path(sysconfig.get_paths()["include"])):
        include += ["-isystem", str(directory)]
    return ["nice", "-n", "10", compiler, *FLAGS, *include, unit]


def cache_key(
    tree: Path, files: Sequence[str], argv: Sequence[str], identity: str, stand_ins: Path,
    generated: Path | None = None,
) -> str:  # fmt: skip
    """The unit's cache key: the command, ``identity`` (the header set's and the
    compiler's version) and every byte of the tree's files and stand-ins it reads."""
    digest = hashlib.sha256()
    # The stand-ins' directory is a scratch one, new every run: their content counts.
    command = [arg.replace(str(stand_ins), f"<{STAND_INS}>") for arg in argv]
    digest.update(json.dumps([command, identity]).encode())
    for name in files:
        digest.update(f"\0{name}\0".encode() + source_path(tree, generated, name).read_bytes())
    for path in sorted(stand_ins.rglob("*")) if stand_ins.is_dir() else ():
        if path.is_file():
            digest.update(f"\0{path.relative_to(stand_ins)}\0".encode() + path.read_bytes())
    return digest.hexdigest()


def compiler_version(compiler: str) -> str:
    done = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()[0] if done.stdout else compiler


def compile_unit(
    tree: Path, unit: str, argv: Sequence[str], key: str, cache: Path, headers: Headers,
    stand_ins: Path,
) -> UnitResult:  # fmt: skip
    entry = cache / f"{key}.json"
    try:
        # A per-machine cache: a FIFO or device put there is refused before it is opened.
        recorded = json.loads(filemode.read_shared(entry, what="series-compile cache entry"))
        return UnitResult(unit, tuple(UnitError(**e) for e in recorded["errors"]), True)
    except FileNotFoundError:
        pass
    except (ValueError, KeyError, TypeError):
        pass  # an unreadable entry is compiled again and replaced
    try:
        done = runner.run(
            argv, cwd=tree, base_env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                      "LC_ALL": "C"},
            echo="none", timeout=COMPILE_TIMEOUT_S, check=False,
        )  # fmt: skip
    except runner.StepTimedOut:
        return UnitResult(unit, (), False, timed_out=True)
    errors = parse_errors(done.stderr, tree, headers, stand_ins)
    if done.returncode != 0 and not errors:
        last = done.stderr.strip().splitlines()[-1:] or ["the compiler failed"]
        errors = (UnitError(unit, "", last[0], 0),)
    cache.mkdir(parents=True, exist_ok=True)
    record = {"unit": unit, "errors": [asdict(e) for e in errors]}
    filemode.write_by_rename(entry, (json.dumps(record, indent=1) + "\n").encode())
    return UnitResult(unit, errors, False)


def parse_errors(
    stderr: str, tree: Path, headers: Headers, stand_ins: Path
) -> tuple[UnitError, ...]:
    """g++'s ``error:`` lines with the text of the line each points at, each once."""
    found: dict[tuple[str, str, str, int], UnitError] = {}
    for raw in stderr.splitlines():
        if not (match := _DIAGNOSTIC.match(raw)):
            continue
        where = Path(match.group("path"))
        absolute = where if where.is_absolute() else tree / where
        number = int(match.group("line"))
        error = UnitError(
            _shown(absolute, tree, headers, stand_ins),
            _line_text(absolute, number),
            match.group("message").strip(),
            number,
            fatal=match.group("fatal") is not None,
        )
        found.setdefault((*error.key, error.line), error)
    return tuple(found.values())


def _shown(path: Path, tree: Path, headers: Headers, stand_ins: Path) -> str:
    path = Path(os.path.normpath(path))
    for base, label in ((stand_ins, "<stand-in>"), (headers.root, "<headers>"), (tree, "")):
        if path.is_relative_to(base):
            relative = path.relative_to(base).as_posix()
            return f"{label}/{relative}" if label else relative
    return path.as_posix()


def _line_text(path: Path, number: int) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return lines[number - 1].strip() if 0 < number <= len(lines) else ""


# --- the whole series -----------------------------------------------------------------------


def compile_series(
    base_tree: Path,
    patched_tree: Path,
    patches: Mapping[str, str],
    headers: Headers,
    cache_dir: Path,
    work: Path,
    *,
    units: Sequence[str] | None = None,
    jobs: int | None = None,
) -> SeriesCompileReport:
    """Compile the units the series touches in both trees and compare their errors.

    ``patched_tree`` holds the series as commits (``patches``: commit -> patch relpath) on
    the commit ``base_tree`` is at; ``units`` narrows the units (default: all it touches).
    """
    compiler = shutil.which("g++")
    if compiler is None:
        raise ToolchainError("g++ is not installed", fix="install it (Debian: apt-get install g++)")
    base = git(["rev-parse", "HEAD"], cwd=base_tree).stdout.strip()
    touched = touched_units(patched_tree, changed_files(patched_tree, base))
    if units is not None:
        touched = [unit for unit in touched if unit in set(units)]
    trees = (base_tree, patched_tree)
    generated = {tree: generate_code(tree, headers, cache_dir) for tree in trees}
    graphs = {tree: include_graph(tree, generated[tree]) for tree in trees}
    identity = f"{headers.identity} {compiler_version(compiler)}"
    cache = cache_dir / SUBDIR / ERRORS_SUBDIR
    stand_ins: set[str] = set()
    jobs_list = []
    for tree in (base_tree, patched_tree):
        graph = graphs[tree]
        present = [u for u in touched if u in graph]  # a unit the series adds has no base
        files = sorted({f for u in present for f in closure(u, graph)})
        missing = missing_includes(tree, files, headers, graph, generated[tree])
        stand_ins.update(missing)
        directory = work / ("base" if tree is base_tree else "patched") / STAND_INS
        write_stand_ins(directory, missing)
        for unit in present:
            argv = compile_argv(unit, headers, directory, compiler, generated[tree])
            key = cache_key(tree, closure(unit, graph), argv, identity, directory, generated[tree])
            jobs_list.append((tree, unit, argv, key, directory))
    log.info(f"series-compile: {len(touched)} unit(s) the series touches, base and patched")
    workers = jobs or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(
            lambda job: (job[0], compile_unit(job[0], job[1], job[2], job[3], cache, headers,
                                              job[4])),
            jobs_list,
        ))  # fmt: skip
    by_tree: dict[Path, dict[str, UnitResult]] = {base_tree: {}, patched_tree: {}}
    for tree, result in results:
        by_tree[tree][result.unit] = result
    base_results = tuple(by_tree[base_tree].get(u, UnitResult(u, (), True)) for u in touched)
    patched_results = tuple(by_tree[patched_tree][u] for u in touched)
    new = [
        NewError(result.unit, error, _blame(patched_tree, error, patches))
        for before, result in zip(base_results, patched_results, strict=True)
        for error in result.errors
        if error.key not in {e.key for e in before.errors}
    ]
    return SeriesCompileReport(
        tuple(touched),
        base_results,
        patched_results,
        tuple(new),
        tuple(sorted(stand_ins)),
        headers,
    )


def _blame(tree: Path, error: UnitError, patches: Mapping[str, str]) -> str | None:
    if error.path.startswith("<") or error.line <= 0:
        return None
    done = git(
        ["blame", "--porcelain", "-L", f"{error.line},{error.line}", "HEAD", "--", error.path],
        cwd=tree,
        check=False,
    )
    commit = done.stdout.split(" ", 1)[0] if done.returncode == 0 else ""
    return patches.get(commit)
