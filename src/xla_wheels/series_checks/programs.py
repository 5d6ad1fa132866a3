"""The series' check programs, as data, and the generated files they are built from.

A program is one entry of :data:`ALL`: its main file(s) under ``patches/torch_xla/checks/``
(kind ``checks``) or upstream's own test in the tree (kind ``gtest``), the tree files
compiled as they are, the ``.inc`` files generated from the tree, and whether it needs absl
or the stand-in OpenXLA declarations. Adding a program is adding an entry.

Generated files take code verbatim from the tree and start each piece with a
``#line N "<tree-relative path>"`` directive, so that g++'s errors in it name the tree's
file and line (which ``git blame`` maps to the patch that wrote it):

- :class:`Function`: a function, from the line starting with its signature to the first
  ``}`` at column 0 (or that line alone, when it holds the whole function);
- :class:`Members`: named data-member declarations of a class in a header. A member the
  header lacks is left out, so the program fails to compile naming it: that is how a
  series that applies to another base but no longer builds there is caught;
- :class:`StdIncludes`: a file's standard-library ``#include <...>`` lines (so an include
  the patched file forgot fails here too);
- :class:`CanonicalCases`: not from the tree but from the project: the table of canonical
  HLO cases as C++ initializers, each module with its canonical text by the Python rules
  (``xla_host.gate.hlo_canonical``), so that one table runs through both languages and
  the C++ check compares their texts.

Kind ``checks``: the program prints ``PASS <name>`` or ``FAIL <name>: <why>`` per check and
exits with the number of failures. Kind ``gtest``: a googletest binary linked with
``gtest_main``.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from xla_host.gate.hlo_canonical import canonical_text

#: Where this source checkout keeps the check programs (editable install, as ``make``
#: sets it up); callers with another project root pass it to ``run_series_checks``.
PROJECT_ROOT = Path(__file__).resolve().parents[3]
CHECKS_SUBDIR = Path("patches") / "torch_xla" / "checks"
STAND_INS_SUBDIR = CHECKS_SUBDIR / "stand_ins"
#: The one table of canonical HLO cases: the C++ rules run it in the check program
#: cache_key_check (generated into canonical_hlo_cases.inc), the Python rules in
#: tests/test_hlo_canonical.py.
CANONICAL_CASES_TABLE = f"{CHECKS_SUBDIR.as_posix()}/canonical_hlo_cases.toml"

RUNTIME = "torch_xla/csrc/runtime"
CLIENT_CPP = f"{RUNTIME}/pjrt_computation_client.cpp"
CLIENT_H = f"{RUNTIME}/pjrt_computation_client.h"
EXECUTOR_CPP = "torch_xla/csrc/xla_graph_executor.cpp"

Kind = Literal["checks", "gtest"]

#: The extension every torch_xla library ends up in (the root BUILD's cc_binary).
XLAC_TARGET = "//:_XLAC.so"


@dataclass(frozen=True)
class Function:
    """``inc`` gets the function of tree file ``path`` whose first line starts with
    ``signature``."""

    inc: str
    path: str
    signature: str
    through: str = ""
    """When set, the text runs on to the end of the function starting with ``through``
    (several neighbouring functions, in the tree's order, as one piece)."""


@dataclass(frozen=True)
class Members:
    """``inc`` gets the declarations of data members ``names`` of ``class_name`` in the
    tree's header ``path``, verbatim; members the header lacks are left out."""

    inc: str
    path: str
    class_name: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class StdIncludes:
    """``inc`` gets the ``#include <...>`` lines of the standard library in ``path``."""

    inc: str
    path: str


@dataclass(frozen=True)
class CanonicalCases:
    """``inc`` gets the cases of the table ``path`` (relative to the project) as C++
    initializers ``{name, equal, a, b, python canonical a, python canonical b}``."""

    inc: str
    path: str


Generated = Function | Members | StdIncludes | CanonicalCases


@dataclass(frozen=True)
class CheckProgram:
    name: str
    kind: Kind
    sources: tuple[str, ...] = ()
    """Files under patches/torch_xla/checks/ (the program's own code)."""
    tree_sources: tuple[str, ...] = ()
    """Files of the tree compiled as they are (for ``gtest``: the test itself first)."""
    generated: tuple[Generated, ...] = ()
    absl_libraries: tuple[str, ...] = ()
    """absl libraries linked; empty: the program needs no absl at all (and is never held
    back because absl is missing)."""
    stand_ins: bool = False
    """Compile with the stand-in OpenXLA declarations (they include absl)."""
    compile_flags: tuple[str, ...] = ()
    """Extra g++ flags (e.g. ``-fsanitize=thread`` for a race check)."""
    arguments: tuple[str, ...] = ()
    """Arguments the program is run with (one source can serve two programs)."""
    link_target: str = XLAC_TARGET
    """The Bazel target of the tree the program stands for: it is linked with exactly the
    torch libraries that target declares (:mod:`xla_wheels.series_checks.build_deps`).
    ``//:_XLAC.so`` for functions that are only linked into the extension."""
    python: bool = False
    """Compile and link against CPython (pybind11's embedded interpreter)."""
    llvm_support: bool = False
    """Compile against LLVM's headers and link its Support library (llvm::SHA256 of the disk
    key: ``@llvm-project//llvm:Support`` in the tree's BUILD)."""

    @property
    def needs_absl(self) -> bool:
        return bool(self.absl_libraries) or self.stand_ins


_CACHE_KEY_FILES: tuple[Generated, ...] = (
    Function("describe_runtime.inc", CLIENT_CPP, "std::string describe_runtime("),
    Function("hash_comp_env.inc", CLIENT_CPP, "torch::lazy::hash_t hash_comp_env("),
    Function(
        "hash_compilation_env.inc",
        CLIENT_CPP,
        "torch::lazy::hash_t PjRtComputationClient::HashCompilationEnv(",
    ),
    Function(
        "set_custom_compile_options.inc",
        CLIENT_CPP,
        "void PjRtComputationClient::SetCustomCompileOptions(",
    ),
    StdIncludes("std_includes.inc", CLIENT_CPP),
    # The declarations the functions are checked against, from the tree's headers: the
    # base's virtual, the override, and the members they use (series 0003 adds the mutex
    # and the hash). A tree lacking one fails to compile naming it.
    Members(
        "computation_client_members.inc",
        f"{RUNTIME}/computation_client.h",
        "ComputationClient",
        ("SetCustomCompileOptions",),
    ),
    Members(
        "client_members.inc",
        CLIENT_H,
        "PjRtComputationClient",
        (
            "SetCustomCompileOptions",
            "comp_env_hash_",
            "custom_compile_options_mutex_",
            "custom_compile_options_",
            "custom_compile_options_hash_",
        ),
    ),
)

COMP_ENV_HASH_CHECK = CheckProgram(
    name="comp_env_hash_check",
    kind="checks",
    sources=("comp_env_hash_check.cpp",),
    tree_sources=(f"{RUNTIME}/env_hash.cpp", f"{RUNTIME}/sys_util.cpp"),
    generated=_CACHE_KEY_FILES,
    absl_libraries=("absl_strings", "absl_statusor", "absl_status"),
    stand_ins=True,
)

# The same program under ThreadSanitizer, in its race mode: SetCustomCompileOptions on one
# thread while HashCompilationEnv runs on another must be free of data races.
CUSTOM_OPTIONS_RACE_CHECK = replace(
    COMP_ENV_HASH_CHECK,
    name="custom_options_race_check",
    compile_flags=("-fsanitize=thread", "-g"),
    arguments=("--race-setter-and-key",),
)

# Series 0003: the lowering settings CollectSyncTensors merges into the in-memory index (the
# matmul precision); XlaHelpers and xla::PrecisionConfig are stand-ins in the program itself.
LOWERING_KEY_CHECK = CheckProgram(
    name="lowering_key_check",
    kind="checks",
    sources=("lowering_key_check.cpp",),
    generated=(
        Function(
            "hash_lowering_settings.inc",
            "torch_xla/csrc/xla_graph_executor.cpp",
            "torch::lazy::hash_t HashLoweringSettings(",
        ),
    ),
)

# Series 0001: DeserializeComputation against a fake PJRT client.
LOAD_CHECK = CheckProgram(
    name="load_check",
    kind="checks",
    sources=("load_check.cpp",),
    generated=(
        Function(
            "deserialize_computation.inc",
            CLIENT_CPP,
            "ComputationClient::ComputationPtr PjRtComputationClient::DeserializeComputation(",
        ),
    ),
    absl_libraries=("absl_status", "absl_statusor", "absl_strings", "absl_cord"),
    stand_ins=True,
)

# cache.h is a header-only library; its cc_test is what links it on its own.
PERSISTENT_CACHE_CHECK = CheckProgram(
    name="persistent_cache_check",
    kind="checks",
    sources=("persistent_cache_check.cpp",),
    link_target=f"//{RUNTIME}:cache_test",
)

# The same program under AddressSanitizer, only the check of a cache without a memory tier
# (XLAGraphExecutor's persistent cache: size 0): an evicted element used after its eviction
# is a finding only a sanitizer makes reliably.
PERSISTENT_CACHE_ASAN_CHECK = replace(
    PERSISTENT_CACHE_CHECK,
    name="persistent_cache_asan_check",
    compile_flags=("-fsanitize=address", "-g"),
    arguments=("--memory-size-zero",),
)

# Series 0002: GetRuntimeMemoryInfo (_xla_runtime_memory_info) with an embedded Python.
RUNTIME_MEMORY_CHECK = CheckProgram(
    name="runtime_memory_check",
    kind="checks",
    sources=("runtime_memory_check.cpp",),
    generated=(
        Function(
            "get_runtime_memory_info.inc",
            "torch_xla/csrc/init_python_bindings.cpp",
            "py::dict GetRuntimeMemoryInfo(",
        ),
    ),
    absl_libraries=("absl_strings", "absl_statusor", "absl_status"),
    python=True,
)

# Series 0003: the persistent cache key (runtime/cache_key.cpp): the canonical HLO rules
# over the table, against the Python rules' texts, and the key's composition.
CACHE_KEY_CHECK = CheckProgram(
    name="cache_key_check",
    kind="checks",
    sources=("cache_key_check.cpp",),
    tree_sources=(f"{RUNTIME}/cache_key.cpp",),
    generated=(CanonicalCases("canonical_hlo_cases.inc", CANONICAL_CASES_TABLE),),
    llvm_support=True,  # the disk key is LLVM's SHA-256
)

# Series 0003: the flag parts of the key (PersistentCacheKeyInputs): the flags as the client
# saw them at its creation, XLA_FLAGS parsed without stopping the process, the debug fields
# outside the key found in the descriptor. DebugOptions, its descriptor and tsl's flag
# parser are stand-ins in the program itself.
FLAG_SNAPSHOT_CHECK = CheckProgram(
    name="flag_snapshot_check",
    kind="checks",
    sources=("flag_snapshot_check.cpp",),
    tree_sources=(f"{RUNTIME}/env_hash.cpp", f"{RUNTIME}/sys_util.cpp"),
    generated=(
        Function(
            "clear_debug_options_outside_key.inc",
            CLIENT_CPP,
            "void ClearDebugOptionsOutsideKey(",
        ),
        Function(
            "debug_options_key.inc", CLIENT_CPP, "absl::StatusOr<std::string> DebugOptionsKey("
        ),
        Function(
            "persistent_cache_key_inputs.inc",
            CLIENT_CPP,
            "absl::StatusOr<cache_key::DiskKeyInputs>",
        ),
        StdIncludes("std_includes.inc", CLIENT_CPP),
        Members(
            "flag_client_members.inc",
            CLIENT_H,
            "PjRtComputationClient",
            ("runtime_description_", "flag_snapshot_", "debug_options_key_"),
        ),
    ),
    absl_libraries=("absl_strings", "absl_statusor", "absl_status"),
    stand_ins=True,  # sys_util.h includes xla/types.h
)

# Series 0003: how Compile() takes the disk key (PersistentCacheKey in
# xla_graph_executor.cpp): a failure while keying skips the persistent cache for the graph,
# counted, and never throws; the module, its proto round trip and the client are stand-ins.
PERSISTENT_CACHE_KEY_CHECK = CheckProgram(
    name="persistent_cache_key_check",
    kind="checks",
    sources=("persistent_cache_key_check.cpp",),
    tree_sources=(f"{RUNTIME}/cache_key.cpp",),
    generated=(
        Function(
            "persistent_cache_key.inc",
            EXECUTOR_CPP,
            "void WarnPersistentCacheOnce(",
            through="std::optional<std::string> PersistentCacheKey(",
        ),
    ),
    absl_libraries=("absl_strings", "absl_statusor", "absl_status"),
    llvm_support=True,
)

# Series 0003: XLA_FLAGS and LIBTPU_INIT_ARGS read as XLA's parser reads them, through
# upstream's HashXlaEnvVars (so the program runs on every tree).
XLA_FLAGS_CHECK = CheckProgram(
    name="xla_flags_check",
    kind="checks",
    sources=("xla_flags_check.cpp",),
    tree_sources=(f"{RUNTIME}/env_hash.cpp", f"{RUNTIME}/sys_util.cpp"),
    absl_libraries=("absl_strings",),
    stand_ins=True,  # sys_util.h includes xla/types.h
    link_target=f"//{RUNTIME}:env_hash_test",
)

# The custom-call patch: the node's hash seed of ops/custom_call.cpp.
CUSTOM_CALL_HASH_CHECK = CheckProgram(
    name="custom_call_hash_check",
    kind="checks",
    sources=("custom_call_hash_check.cpp",),
    generated=(
        Function(
            "custom_call_hash_seed.inc",
            "torch_xla/csrc/ops/custom_call.cpp",
            "torch::lazy::hash_t CustomCallHashSeed(",
        ),
    ),
)

UPSTREAM_CACHE_TEST = CheckProgram(
    name="cache_test",
    kind="gtest",
    tree_sources=(f"{RUNTIME}/cache_test.cpp",),
    link_target=f"//{RUNTIME}:cache_test",
)

UPSTREAM_ENV_HASH_TEST = CheckProgram(
    name="env_hash_test",
    kind="gtest",
    tree_sources=(
        f"{RUNTIME}/env_hash_test.cpp",
        f"{RUNTIME}/env_hash.cpp",
        f"{RUNTIME}/sys_util.cpp",
    ),
    absl_libraries=("absl_strings",),
    stand_ins=True,  # sys_util.h includes xla/types.h
    link_target=f"//{RUNTIME}:env_hash_test",
)

ALL: tuple[CheckProgram, ...] = (
    LOAD_CHECK,
    RUNTIME_MEMORY_CHECK,
    COMP_ENV_HASH_CHECK,
    CUSTOM_OPTIONS_RACE_CHECK,
    LOWERING_KEY_CHECK,
    CACHE_KEY_CHECK,
    FLAG_SNAPSHOT_CHECK,
    PERSISTENT_CACHE_KEY_CHECK,
    XLA_FLAGS_CHECK,
    PERSISTENT_CACHE_CHECK,
    PERSISTENT_CACHE_ASAN_CHECK,
    CUSTOM_CALL_HASH_CHECK,
    UPSTREAM_CACHE_TEST,
    UPSTREAM_ENV_HASH_TEST,
)


# --- Generated files ------------------------------------------------------------------------


class ExtractionError(Exception):
    """The tree lacks what a generated file takes from it (``run`` reports it per program)."""


def generate(tree: Path, spec: Generated, project_root: Path = PROJECT_ROOT) -> str:
    """The text of a generated ``.inc`` file, taken from ``tree`` (a table of cases: from
    ``project_root``)."""
    if isinstance(spec, CanonicalCases):
        return canonical_cases_text(project_root / spec.path, spec.path)
    path = tree / spec.path
    if not path.is_file():
        raise ExtractionError(f"{spec.path} does not exist in the tree")
    lines = path.read_text(encoding="utf-8").split("\n")
    if isinstance(spec, Function):
        return function_text(lines, spec.path, spec.signature, spec.through)
    if isinstance(spec, Members):
        return members_text(lines, spec.path, spec.class_name, spec.names)
    return std_includes_text(lines)


def _line_directive(index: int, path: str) -> str:
    return f'#line {index + 1} "{path}"\n'


def function_text(lines: list[str], path: str, signature: str, through: str = "") -> str:
    start = next((i for i, line in enumerate(lines) if line.startswith(signature)), None)
    if start is None:
        raise ExtractionError(f"no function starting with {signature!r} in {path}")
    if through:
        last = next((i for i in range(start, len(lines)) if lines[i].startswith(through)), None)
        if last is None:
            raise ExtractionError(f"no function starting with {through!r} after {signature!r}")
        start, piece_start = last, start
    else:
        piece_start = start
    first = lines[start].split("//", 1)[0].rstrip()
    if first.endswith("}") and first.count("{") == first.count("}"):
        end: int | None = start  # a function on one line
    else:
        end = next((i for i in range(start, len(lines)) if lines[i] == "}"), None)
    if end is None:
        raise ExtractionError(f"the function {signature!r} in {path} has no closing '}}'")
    return _line_directive(piece_start, path) + "\n".join(lines[piece_start : end + 1]) + "\n"


def members_text(lines: list[str], path: str, class_name: str, names: tuple[str, ...]) -> str:
    found = member_declarations(lines, path, class_name, names)
    pieces = []
    for name in names:
        if name in found:
            first, last = found[name]
            pieces.append(_line_directive(first, path) + "\n".join(lines[first : last + 1]))
        else:
            # Left out on purpose: the program's use of it fails to compile, naming it.
            pieces.append(f"// {class_name}::{name}: not declared in {path}")
    return "\n".join(pieces) + "\n"


def member_declarations(
    lines: list[str], path: str, class_name: str, names: tuple[str, ...]
) -> dict[str, tuple[int, int]]:
    """name -> (first, last) line index of its declaration at the class's member level."""
    definition = re.compile(rf"\s*(class|struct) {re.escape(class_name)}\b[^;]*$")
    start = next((i for i, line in enumerate(lines) if definition.match(line)), None)
    if start is None:
        raise ExtractionError(f"no definition of class {class_name} in {path}")
    declares = {
        # A data member (with an initializer or not) or a member function's declaration.
        name: re.compile(rf"\b{re.escape(name)}\s*(\([^;]*|=[^;]*|\{{[^;]*\}})?;$")
        for name in names
    }
    found: dict[str, tuple[int, int]] = {}
    depth = 0
    statement: list[int] = []  # line indices of the member-level statement being read
    for i in range(start, len(lines)):
        code = lines[i].split("//", 1)[0]
        opened, closed = code.count("{"), code.count("}")
        if depth == 1 and opened == closed:
            stripped = code.strip()
            if not stripped or re.fullmatch(r"(public|private|protected)\s*:", stripped):
                statement = []
            else:
                statement.append(i)
                if stripped.endswith(";"):
                    text = " ".join(lines[j].split("//", 1)[0].strip() for j in statement)
                    for name, pattern in declares.items():
                        if name not in found and pattern.search(text):
                            found[name] = (statement[0], i)
                    statement = []
        else:
            statement = []  # a block (inline function, nested type) is no declaration
        depth += opened - closed
        if depth <= 0 and i > start and (opened or closed):
            break
    return found


def std_includes_text(lines: list[str]) -> str:
    includes = [line for line in lines if re.fullmatch(r"#include <[a-z_]+>", line)]
    return "\n".join(includes) + "\n"


def canonical_cases_text(table: Path, display: str) -> str:
    """The table's cases as C++ initializers, with the Python rules' canonical texts."""
    if not table.is_file():
        raise ExtractionError(f"{display} does not exist")
    try:
        cases = tomllib.loads(table.read_text(encoding="utf-8"))["case"]
    except (tomllib.TOMLDecodeError, KeyError) as error:
        raise ExtractionError(f"{display} is not a table of [[case]]: {error}") from error
    rows = []
    for case in cases:
        if case.get("expect") not in ("equal", "different"):
            raise ExtractionError(f"{display}: case {case.get('name')!r} has no valid expect")
        fields = [
            cpp_string(case["name"]),
            "true" if case["expect"] == "equal" else "false",
            cpp_string(case["a"]),
            cpp_string(case["b"]),
            cpp_string(canonical_text(case["a"])),
            cpp_string(canonical_text(case["b"])),
        ]
        rows.append("{" + ",\n ".join(fields) + "},")
    return f"// Generated from {display}: do not edit.\n" + "\n".join(rows) + "\n"


def cpp_string(text: str) -> str:
    """A C++ string literal of ``text``'s UTF-8 bytes, one literal piece per line.

    Ordinary (not raw) literals: a raw literal would let the compiler's line-ending
    handling turn a carriage return of the table into a newline."""
    pieces = []
    for line in text.encode("utf-8").split(b"\n"):
        pieces.append(line)
    literals = []
    for index, line in enumerate(pieces):
        escaped = "".join(_cpp_char(byte) for byte in line)
        newline = "\\n" if index < len(pieces) - 1 else ""
        literals.append(f'"{escaped}{newline}"')
    return "\n  ".join(literals)


def _cpp_char(byte: int) -> str:
    if byte == 0x22:
        return '\\"'
    if byte == 0x5C:
        return "\\\\"
    if 0x20 <= byte < 0x7F and byte != 0x3F:  # "?" escaped: no trigraph can form
        return chr(byte)
    return f"\\{byte:03o}"
