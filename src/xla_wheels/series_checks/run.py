"""Build the check programs against a pytorch/xla tree, run them, and read their verdicts.

A program is built as one ``g++ -c`` per source and one link (:func:`build_plan`); the
compile steps go through ccache when the toolchain has it, so a source compiled before on
this machine, in any copy of the tree, is not compiled again (a failed compile never is
cached: every finding comes from a real g++ run).

:func:`run_series_checks` returns one :class:`CheckOutcome` per program: its verdicts
(check -> ``"PASS"`` or the reason it failed) when it compiled, else g++'s errors parsed
into :class:`CompileError` (file relative to the tree, line, and the identifier g++ says
is missing), which is what tells "the series applies" apart from "it builds".

A program that compiled but did not keep its contract (crashed, timed out, printed no
verdict, or exited with another status than its failure count) gets a verdict under
:data:`PROGRAM_VERDICT` saying so, so it can never pass by accident.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from xla_host import runner
from xla_wheels.series_checks.build_deps import BuildFileError, torch_libraries
from xla_wheels.series_checks.programs import (
    ALL,
    CHECKS_SUBDIR,
    PROJECT_ROOT,
    STAND_INS_SUBDIR,
    CheckProgram,
    ExtractionError,
    generate,
)
from xla_wheels.series_checks.toolchain import COMPILER_CACHE_MAX_SIZE, Toolchain

PROGRAM_VERDICT = "(program)"
RUN_TIMEOUT_S = 300.0
COMPILE_TIMEOUT_S = 900.0
"""The limit of each compile step, and of the link."""
#: In a program's work directory: links to the tree and to the project. g++ runs there
#: with paths through them, relative, so that the same sources in another copy of the
#: tree make the same command lines (which ccache's key includes) and its errors name
#: files relative to the tree.
TREE_LINK = ".tree"
PROJECT_LINK = ".project"
GENERATED_SUBDIR = "generated"
OBJECTS_SUBDIR = "objects"


@dataclass(frozen=True)
class CompileError:
    path: str
    """Relative to the tree (files outside it: relative to the project, else as g++ said;
    empty for a linker error)."""
    line: int
    identifier: str | None
    """The name g++ says is missing, undeclared or no member (a header for a missing
    include, a symbol for an undefined reference); None for other errors."""
    message: str


@dataclass(frozen=True)
class CheckOutcome:
    program: str
    verdicts: dict[str, str]
    """check -> "PASS" or the failure reason; empty when it did not compile."""
    compile_errors: tuple[CompileError, ...]
    output: str = ""
    """The compiler's errors, or the program's output: for a human reading a failure."""

    @property
    def failed(self) -> dict[str, str]:
        return {name: why for name, why in self.verdicts.items() if why != "PASS"}


def run_series_checks(
    tree: Path,
    toolchain: Toolchain,
    work: Path,
    programs: Sequence[CheckProgram] = ALL,
    *,
    project_root: Path = PROJECT_ROOT,
) -> list[CheckOutcome]:
    """Build and run ``programs`` against ``tree`` in ``work``; outcomes in program order.

    Programs are built in parallel, their sources too, but never more compilers, linkers
    and check programs at once than there are cores; ``tree`` is only read.
    """
    tree = tree.resolve()
    work.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    slots = threading.BoundedSemaphore(cores)
    workers = max(1, min(len(programs), cores))
    root = project_root.resolve()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(
            pool.map(lambda p: _run_one(p, tree, toolchain, work / p.name, root, slots), programs)
        )


def _run_one(
    program: CheckProgram,
    tree: Path,
    toolchain: Toolchain,
    work: Path,
    project_root: Path,
    slots: threading.BoundedSemaphore,
) -> CheckOutcome:
    generated_dir = work / GENERATED_SUBDIR
    generated_dir.mkdir(parents=True, exist_ok=True)
    for spec in program.generated:
        try:
            text = generate(tree, spec, project_root)
            (generated_dir / spec.inc).write_text(text, encoding="utf-8")
        except ExtractionError as error:
            missing = CompileError(spec.path, 0, None, f"cannot generate {spec.inc}: {error}")
            return CheckOutcome(program.name, {}, (missing,), str(error))
    try:
        linked = torch_libraries(tree, program.link_target)
    except BuildFileError as error:
        unreadable = CompileError("", 0, None, f"cannot read the link dependencies: {error}")
        return CheckOutcome(program.name, {}, (unreadable,), str(error))
    if program.llvm_support and toolchain.llvm is None:
        missing = CompileError("", 0, None, "the toolchain has no LLVM Support library")
        return CheckOutcome(program.name, {}, (missing,), missing.message)
    if needs_libpython(program, linked) and toolchain.python is None:
        missing = CompileError("", 0, None, "the torch environment's Python has no libpython")
        return CheckOutcome(program.name, {}, (missing,), missing.message)
    plan = build_plan(program, toolchain, work, torch_libraries=linked)
    for name, target in ((TREE_LINK, tree), (PROJECT_LINK, project_root)):
        _link(work / name, target)
    (work / OBJECTS_SUBDIR).mkdir(exist_ok=True)

    def step(argv: Sequence[str], env: Mapping[str, str]) -> _Ran:
        with slots:
            try:
                done = runner.run(
                    argv,
                    cwd=work,
                    base_env=env,
                    echo="none",
                    timeout=COMPILE_TIMEOUT_S,
                    check=False,  # g++'s errors are the check's findings
                )
            except runner.StepTimedOut:
                return _Ran(None, "")
        return _Ran(done.returncode, done.stderr)

    # Every source is compiled even when one fails: all of g++'s errors are findings.
    with ThreadPoolExecutor(max_workers=max(1, len(plan.compiles))) as compilers:
        ran = list(compilers.map(lambda c: step(c.argv, plan.compile_env), plan.compiles))
    if all(one.status == 0 for one in ran):
        ran.append(step(plan.link, plan.link_env))
    if any(one.status is None for one in ran):
        timed_out = CompileError("", 0, None, f"g++ did not finish in {COMPILE_TIMEOUT_S:.0f}s")
        return CheckOutcome(program.name, {}, (timed_out,))
    if failed := [one.stderr for one in ran if one.status != 0]:
        stderr = "".join(failed)
        return CheckOutcome(
            program.name, {}, parse_compile_errors(stderr, tree, project_root), stderr
        )
    return _execute(program, work / program.name, work, slots)


class _Ran(NamedTuple):
    status: int | None
    """None: it did not finish in time."""
    stderr: str


def _link(path: Path, target: Path) -> None:
    """``path`` -> ``target``, replaced by rename (a link left by an earlier run may point
    at another copy of the tree)."""
    staging = path.with_name(f"{path.name}.new")
    staging.unlink(missing_ok=True)
    staging.symlink_to(target, target_is_directory=True)
    staging.replace(path)


def needs_libpython(program: CheckProgram, torch_libraries: tuple[str, ...]) -> bool:
    """An embedded interpreter, or libtorch_python: the extension gets CPython's symbols
    from the interpreter that loads it, a check program (an executable) from libpython."""
    return program.python or "torch_python" in torch_libraries


@dataclass(frozen=True)
class CompileStep:
    source: str
    """As g++ is given it: relative to the work directory (through its links)."""
    obj: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class BuildPlan:
    """How one program is built: each step runs in the program's work directory, where
    :data:`TREE_LINK` and :data:`PROJECT_LINK` lead to the tree and the project."""

    compiles: tuple[CompileStep, ...]
    """One ``g++ -c`` per source, through ccache when the toolchain has it."""
    link: tuple[str, ...]
    """Never cached: it is quick, and its errors (an undeclared library) are findings."""
    compile_env: Mapping[str, str]
    link_env: Mapping[str, str]


def build_plan(
    program: CheckProgram,
    toolchain: Toolchain,
    work: Path,
    *,
    torch_libraries: tuple[str, ...] = ("torch_cpu", "c10"),
) -> BuildPlan:
    """The g++ steps: the tree and the checks on the include path, torch's headers as
    system headers, linked against the torch libraries the program's Bazel target
    declares (``torch_libraries``, from the tree's BUILD files) and absl, googletest.

    Paths into the tree and the project are relative to ``work`` (through its links), so
    that the same sources in another copy of the tree give the same command lines, which
    ccache's key includes, and g++'s errors name files relative to the tree.

    Over 80 lines: one plan, step by step (compile, then link with LLVM's Support library
    where a program needs it); split, each step would need the whole plan's state passed.
    """
    torch = toolchain.torch
    checks = Path(PROJECT_LINK) / CHECKS_SUBDIR
    include = [f"-I{TREE_LINK}", f"-I{checks}", f"-I{GENERATED_SUBDIR}"]
    if program.stand_ins:
        include.append(f"-I{Path(PROJECT_LINK) / STAND_INS_SUBDIR}")
    include += ["-isystem", str(torch / "include")]
    include += ["-isystem", str(torch / "include" / "torch" / "csrc" / "api" / "include")]
    libraries = [f"-L{torch / 'lib'}", f"-Wl,-rpath,{torch / 'lib'}"]
    libraries += [f"-l{name}" for name in torch_libraries]
    if program.needs_absl:
        include += ["-isystem", str(toolchain.absl.include)]
        libraries += [f"-L{toolchain.absl.lib}", f"-Wl,-rpath,{toolchain.absl.lib}"]
        libraries += [f"-l{name}" for name in program.absl_libraries]
    if needs_libpython(program, torch_libraries) and toolchain.python is not None:
        python = toolchain.python
        include += ["-isystem", str(python.include)]
        libraries += [f"-L{python.lib}", f"-Wl,-rpath,{python.lib}", f"-l{python.library}"]
    if program.llvm_support and toolchain.llvm is not None:
        for directory in toolchain.llvm.include:
            include += ["-isystem", str(directory)]
        libraries.append(str(toolchain.llvm.library))
    if program.kind == "gtest":
        include += ["-isystem", str(toolchain.gtest.include)]
        libraries += [f"-L{toolchain.gtest.lib}", "-lgtest_main", "-lgmock", "-lgtest"]
    sources = [str(checks / name) for name in program.sources]
    sources += [str(Path(TREE_LINK) / path) for path in program.tree_sources]
    flags = [
        "-std=c++17",
        "-O0",
        "-fdiagnostics-color=never",
        # Debug info names the work directory "." (a -g program's objects are then the
        # same from any work directory, and ccache may share them).
        f"-fdebug-prefix-map={work}=.",
        *program.compile_flags,
    ]
    cache = toolchain.compiler_cache
    launcher = [str(cache.executable)] if cache is not None else []
    compiles = tuple(
        CompileStep(
            source,
            obj := f"{OBJECTS_SUBDIR}/{index}-{Path(source).stem}.o",
            (*launcher, str(toolchain.compiler), *flags, *include, "-c", source, "-o", obj),
        )
        for index, source in enumerate(sources)
    )
    link = (
        str(toolchain.compiler),
        *program.compile_flags,  # -fsanitize=thread links its runtime
        *(step.obj for step in compiles),
        "-o",
        program.name,
        *libraries,
        "-pthread",
    )
    # LC_ALL=C: g++ quotes names with ASCII quotes, which the parser below reads.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    compile_env = dict(env)
    if cache is not None:
        compile_env |= {
            "CCACHE_DIR": str(cache.directory),
            "CCACHE_MAXSIZE": COMPILER_CACHE_MAX_SIZE,
            # With -g, g++'s preprocessed output names the working directory; the objects
            # do not (-fdebug-prefix-map above), so it need not be in the key.
            "CCACHE_NOHASHDIR": "1",
        }
    return BuildPlan(compiles, link, compile_env, env)


def _execute(
    program: CheckProgram, binary: Path, work: Path, slots: threading.BoundedSemaphore
) -> CheckOutcome:
    scratch = work / "tmp"
    scratch.mkdir(exist_ok=True)
    # A small fixed environment: the checks set the variables they test themselves, and an
    # XLA_FLAGS of the caller must not change a hash they compare.
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "TMPDIR": str(scratch), "HOME": str(scratch)}
    argv = [str(binary), *program.arguments]
    try:
        with slots:
            ran = runner.run(
                argv, cwd=scratch, base_env=env, echo="none", timeout=RUN_TIMEOUT_S, check=False
            )
    except runner.StepTimedOut as expired:
        verdicts = _verdicts(program, expired.output)
        verdicts[PROGRAM_VERDICT] = f"did not finish in {RUN_TIMEOUT_S:.0f}s"
        return CheckOutcome(program.name, verdicts, (), expired.output)
    verdicts = _verdicts(program, ran.stdout)
    if problem := _contract_problem(program, verdicts, ran.returncode):
        verdicts[PROGRAM_VERDICT] = problem
    return CheckOutcome(program.name, verdicts, (), ran.stdout + ran.stderr)


def _verdicts(program: CheckProgram, stdout: str) -> dict[str, str]:
    return parse_gtest(stdout) if program.kind == "gtest" else parse_checks(stdout)


def _contract_problem(program: CheckProgram, verdicts: dict[str, str], status: int) -> str:
    failures = sum(why != "PASS" for why in verdicts.values())
    if status < 0:
        return f"killed by signal {-status} after {len(verdicts)} verdict(s)"
    if not verdicts:
        return f"printed no verdict (exit status {status})"
    expected = failures if program.kind == "checks" else int(failures > 0)
    if status != expected:
        return f"exit status {status} with {failures} failed check(s)"
    return ""


def parse_checks(stdout: str) -> dict[str, str]:
    """``PASS <name>`` / ``FAIL <name>: <why>`` lines; other output is ignored."""
    verdicts: dict[str, str] = {}
    for line in stdout.splitlines():
        status, _, rest = line.partition(" ")
        if status == "PASS" and rest:
            verdicts[rest.strip()] = "PASS"
        elif status == "FAIL" and rest:
            name, _, why = rest.partition(": ")
            verdicts[name.strip()] = why or "failed"
    return verdicts


_GTEST_RUN = re.compile(r"^\[ RUN      \] (\S+)$")
_GTEST_OK = re.compile(r"^\[       OK \] (\S+) \(\d+ ms\)$")
_GTEST_FAILED = re.compile(r"^\[  FAILED  \] (\S+) \(\d+ ms\)$")
_GTEST_SKIPPED = re.compile(r"^\[  SKIPPED \] (\S+) \(\d+ ms\)$")


def parse_gtest(stdout: str) -> dict[str, str]:
    """googletest's per-test lines: ``Suite.Test`` -> "PASS" or its failure messages."""
    verdicts: dict[str, str] = {}
    body: list[str] = []
    for line in stdout.splitlines():
        if _GTEST_RUN.match(line):
            body = []
        elif match := _GTEST_OK.match(line):
            verdicts[match.group(1)] = "PASS"
        elif match := _GTEST_FAILED.match(line):
            text = " | ".join(part.strip() for part in body if part.strip())
            verdicts[match.group(1)] = text[:500] or "failed"
        elif match := _GTEST_SKIPPED.match(line):
            verdicts[match.group(1)] = "skipped"
        else:
            body.append(line)
    return verdicts


# --- g++'s errors ---------------------------------------------------------------------------

_DIAGNOSTIC = re.compile(
    r"^(?P<path>[^:\s][^:]*):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<message>.*)$"
)
_UNDEFINED = re.compile(r"undefined reference to (?:symbol )?[`'](?P<symbol>[^']+)'")
# GNU ld and gold: a symbol found only in a library that another library needs
# (DT_NEEDED) but that is not on the command line, i.e. not declared by the target.
_DSO_MISSING = re.compile(
    r"(?P<library>[^\s:]+): error adding symbols: DSO missing from command line"
)
_IDENTIFIER = (
    re.compile(r"no member named '(?P<id>[^']+)'"),
    re.compile(r"^'(?P<id>[^']+)' is not a member of '"),
    re.compile(r"^'(?P<id>[^']+)' has not been declared"),
    re.compile(r"^'(?P<id>[^']+)' does not name a type"),
    re.compile(r"^'(?P<id>[^']+)' was not declared"),
    re.compile(r"^(?P<id>[^:\s]+): No such file or directory"),
    # A member function defined in the tree but declared nowhere in its class.
    re.compile(r"^no declaration matches '[^']*?(?P<id>\w+)\("),
)


def identifier_of(message: str) -> str | None:
    """The name g++'s error message says is missing, if it names one."""
    for pattern in _IDENTIFIER:
        if match := pattern.search(message):
            return match.group("id")
    return None


def parse_compile_errors(
    stderr: str, tree: Path, project_root: Path = PROJECT_ROOT
) -> tuple[CompileError, ...]:
    """g++'s ``error:`` lines (and the linker's undefined references); never empty for
    a failed build: an error that fits neither is kept as one unnamed entry."""
    errors: list[CompileError] = []
    for line in stderr.splitlines():
        if match := _DIAGNOSTIC.match(line):
            message = match.group("message").strip()
            path = _display_path(match.group("path"), tree, project_root)
            error = CompileError(path, int(match.group("line")), identifier_of(message), message)
        elif match := _DSO_MISSING.search(line):
            library = Path(match.group("library")).name
            error = CompileError(
                "",
                0,
                library,
                f"DSO missing from command line: {library} is needed but the program's "
                "Bazel target does not declare it",
            )
        elif match := _UNDEFINED.search(line):
            symbol = match.group("symbol")
            error = CompileError("", 0, symbol, f"undefined reference to '{symbol}'")
        else:
            continue
        if error not in errors:
            errors.append(error)
    if not errors:
        last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
        errors.append(CompileError("", 0, None, last.strip() or "the compiler failed"))
    return tuple(errors)


def _display_path(reported: str, tree: Path, project_root: Path) -> str:
    path = Path(os.path.normpath(reported))
    if not path.is_absolute():
        # Through the work directory's links, or a #line directive's tree-relative path.
        if path.parts[0] in (TREE_LINK, PROJECT_LINK):
            return str(Path(*path.parts[1:]))
        return str(path)
    for base in (tree, project_root):
        if path.is_relative_to(base):
            return str(path.relative_to(base))
    return str(path)
