"""The torch_xla patches: file structure (always), and against the real pytorch/xla source.

The structural checks parse the files themselves, independently of the patch stage's own
parser, so a mistake in one is not hidden by the same mistake in the other. Each checker is
also run on a small broken sample, to show that it can fail.

The real-source tests take their trees from tests/real_source.py (TORCH_XLA_SRC, else the
shared snapshot ../shared/upstream/pytorch-xla.git): the series applied to c04e61c one
commit per patch, and the compiled checks of xla_wheels.series_checks (the programs in
patches/torch_xla/checks/ and upstream's cache_test.cpp and env_hash_test.cpp) built with
g++ against the real torch 2.9.0 headers and libraries, absl and googletest unpacked from
Debian's packages into the per-machine cache. They pass on the patched tree and the
series' own checks fail on the base. Without a source they skip and say why; in CI with
the snapshot present a skip fails. They are not a torch_xla build: see each patch's
Not-verified line and docs/development.md "Compiled checks of the series".
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.gitrepos import git
from tests.real_source import BASE, PATCH_DIR
from xla_wheels.patches import PatchHeader, parse_patch
from xla_wheels.series_checks.programs import (
    CACHE_KEY_CHECK,
    COMP_ENV_HASH_CHECK,
    CUSTOM_CALL_HASH_CHECK,
    CUSTOM_OPTIONS_RACE_CHECK,
    FLAG_SNAPSHOT_CHECK,
    LOAD_CHECK,
    LOWERING_KEY_CHECK,
    PERSISTENT_CACHE_ASAN_CHECK,
    PERSISTENT_CACHE_CHECK,
    PERSISTENT_CACHE_KEY_CHECK,
    RUNTIME_MEMORY_CHECK,
    XLA_FLAGS_CHECK,
)
from xla_wheels.series_checks.run import CheckOutcome, run_series_checks
from xla_wheels.series_checks.toolchain import Prefix, Toolchain

SERIES = (
    "0001-load-serialized-executables.patch",
    "0002-runtime-memory-info-binding.patch",
    "0003-cache-key-covers-compile-options.patch",
    "0004-persistent-cache-atomic-write.patch",
    "0005-custom-call-hash-covers-attributes.patch",
)
CLIENT_CPP = "torch_xla/csrc/runtime/pjrt_computation_client.cpp"
EXECUTOR_CPP = "torch_xla/csrc/xla_graph_executor.cpp"
CACHE_H = "torch_xla/csrc/runtime/cache.h"
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")


# --- A small, separate parser -------------------------------------------------------------


@dataclass(frozen=True)
class FileDiff:
    path: str
    hunks: tuple[tuple[str, ...], ...]  # each hunk's body lines, with their ' ', '+', '-'

    def added(self) -> list[str]:
        return [line[1:] for hunk in self.hunks for line in hunk if line.startswith("+")]

    def removed(self) -> list[str]:
        return [line[1:] for hunk in self.hunks for line in hunk if line.startswith("-")]

    def new_side(self, hunk: tuple[str, ...]) -> list[tuple[str, bool]]:
        """(text, is_added) for the lines the hunk leaves in the patched file."""
        return [(line[1:], line.startswith("+")) for line in hunk if line[:1] in (" ", "+")]


@dataclass(frozen=True)
class ParsedPatch:
    """A shipped patch: its header as the patch stage reads and validates it
    (xla_wheels.patches.parse_patch, the one header parser), and its diff by hunk."""

    header: PatchHeader
    files: tuple[FileDiff, ...]

    def file(self, path: str) -> FileDiff:
        matches = [diff for diff in self.files if diff.path == path]
        assert matches, f"the diff does not touch {path}"
        return matches[0]


def diff_files(text: str) -> tuple[FileDiff, ...]:
    """The files of a patch's diff part, each with its hunks."""
    lines = text.split("\n")
    first_diff = next((i for i, line in enumerate(lines) if line.startswith("diff --git ")), None)
    assert first_diff is not None, "no 'diff --git' line"
    files: list[FileDiff] = []
    path: str | None = None
    hunks: list[tuple[str, ...]] = []
    body: list[str] | None = None
    for line in lines[first_diff:]:
        match = _DIFF_FILE.match(line)
        if match:
            if body is not None:
                hunks.append(tuple(body))
            if path is not None:
                files.append(FileDiff(path, tuple(hunks)))
            path, hunks, body = match.group(2), [], None
            continue
        if _HUNK.match(line):
            if body is not None:
                hunks.append(tuple(body))
            body = []
        elif body is not None and line[:1] in (" ", "+", "-", "\\"):
            body.append(line)
        elif body is not None and line == "":
            continue  # trailing newline of the file
    if body is not None:
        hunks.append(tuple(body))
    if path is not None:
        files.append(FileDiff(path, tuple(hunks)))
    return tuple(files)


def whitespace_problems(text: str) -> list[str]:
    problems = []
    if "\r" in text:
        problems.append("carriage return (CRLF) in the file")
    for number, line in enumerate(text.split("\n"), start=1):
        if line.startswith("+") and not line.startswith("+++ "):
            if line != line.rstrip():
                problems.append(f"line {number}: trailing whitespace on an added line")
            if "\t" in line:
                problems.append(f"line {number}: tab on an added line (the C++ files use none)")
        if line.startswith(" ") and line != line.rstrip() and line.strip():
            problems.append(f"line {number}: context line with trailing whitespace")
    return problems


def function_body(lines: list[tuple[str, bool]], signature: str) -> list[tuple[str, bool]]:
    """Lines from `signature` to the closing brace at column 0 (patched side of a hunk)."""
    start = next((i for i, (text, _) in enumerate(lines) if signature in text), None)
    if start is None:
        return []
    end = next((i for i in range(start, len(lines)) if lines[i][0] == "}"), len(lines) - 1)
    return lines[start : end + 1]


def member_body(lines: list[tuple[str, bool]], signature: str) -> list[tuple[str, bool]]:
    """Like function_body, for a function defined inside a class: ends at its indented '}'."""
    start = next((i for i, (text, _) in enumerate(lines) if signature in text), None)
    if start is None:
        return []
    indent = lines[start][0][: len(lines[start][0]) - len(lines[start][0].lstrip())]
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i][0] == indent + "}"), len(lines) - 1
    )
    return lines[start : end + 1]


def first_line(function: list[tuple[str, bool]], needle: str) -> int | None:
    return next((i for i, (text, _) in enumerate(function) if needle in text), None)


def calls_in(function: list[tuple[str, bool]], name: str) -> list[int]:
    return [i for i, (text, _) in enumerate(function) if f"{name}(" in text]


def load(name: str) -> ParsedPatch:
    path = PATCH_DIR / name
    header = parse_patch(path, component="torch_xla")
    return ParsedPatch(header, diff_files(path.read_text(encoding="utf-8")))


# --- The checkers can fail ------------------------------------------------------------------

BROKEN = (
    "Subject: x\n"
    "Component: torch\n"
    "Base: c04e61c\n"
    "Files: a.cpp\n"
    "\n"
    "--- looks like a diff\n"
    "diff --git a/b.cpp b/b.cpp\n"
    "--- a/b.cpp\n"
    "+++ b/b.cpp\n"
    "@@ -1,1 +1,2 @@\n"
    " int a;\r\n"
    "+int b; \n"
    "+\tint c;\n"
)


def test_whitespace_checker_rejects_damage() -> None:
    problems = "\n".join(whitespace_problems(BROKEN))
    assert "carriage return" in problems
    assert "trailing whitespace on an added line" in problems
    assert "tab on an added line" in problems


def test_function_finder_tells_which_function_calls_what() -> None:
    lines = [
        ("void F() {", False),
        ("  G();", True),
        ("}", False),
        ("void H() {", False),
        ("  K();", True),
        ("}", False),
    ]
    assert calls_in(function_body(lines, "void F("), "G") == [1]
    assert calls_in(function_body(lines, "void F("), "K") == []
    assert function_body(lines, "void Z(") == []
    members = [
        ("  void A() {", False),
        ("    if (x) {", False),
        ("    }", False),
        ("  }", False),
        ("  void B() {", False),
        ("    K();", True),
        ("  }", False),
    ]
    assert len(member_body(members, "void A(")) == 4
    assert calls_in(member_body(members, "void A("), "K") == []
    assert first_line(member_body(members, "void B("), "K(") == 1


# --- The real files -------------------------------------------------------------------------


def test_series_files_exist_and_sort_in_order() -> None:
    names = sorted(path.name for path in PATCH_DIR.glob("*.patch"))
    # The patch stage applies in file-name order; later local patches may follow these two.
    assert names[: len(SERIES)] == list(SERIES)


@pytest.mark.parametrize("name", SERIES)
def test_no_whitespace_damage(name: str) -> None:
    raw = (PATCH_DIR / name).read_bytes()
    assert raw.endswith(b"\n"), "the file must end with a newline"
    assert whitespace_problems(raw.decode("utf-8")) == []


def test_0001_deserialize_computation_loads_through_load_serialized_executable() -> None:
    diff = load(SERIES[0]).file(CLIENT_CPP)
    function: list[tuple[str, bool]] = []
    for hunk in diff.hunks:
        function = function_body(
            diff.new_side(hunk), "PjRtComputationClient::DeserializeComputation("
        )
        if function:
            break
    assert function, "no hunk covers DeserializeComputation"
    new_calls = calls_in(function, "LoadSerializedExecutable")
    assert new_calls, "DeserializeComputation does not call LoadSerializedExecutable"
    assert all(function[i][1] for i in new_calls), "the call must be an added line"
    # The two-step path may remain, but only after (as a fallback to) the new call ...
    fallback = calls_in(function, "DeserializeExecutable")
    assert fallback and all(i > min(new_calls) for i in fallback)
    # ... taken on any refusal of the one-step path, not only on UNIMPLEMENTED (the
    # StreamExecutor client answers InvalidArgument without CompileOptions).
    assert not calls_in(function, "IsUnimplemented")
    # The unchecked Load(...).value() that threw out of the cache is gone.
    assert not any(".value();" in text and "Load(" in text for text, _ in function)


def test_0002_registers_the_binding_and_drops_the_unchecked_unwrap() -> None:
    patch = load(SERIES[1])
    bindings = patch.file("torch_xla/csrc/init_python_bindings.cpp").added()
    assert any('.def("_xla_runtime_memory_info"' in line for line in bindings)
    client = patch.file("torch_xla/csrc/runtime/pjrt_computation_client.cpp")
    assert any("GetAllocatorStats().value()" in line for line in client.removed())
    assert not any("GetAllocatorStats().value()" in line for line in client.added())


def _patched_function(name: str, path: str, signature: str) -> list[tuple[str, bool]]:
    """The patched side of the hunk of patch `name` in `path` that holds `signature`."""
    diff = load(name).file(path)
    for hunk in diff.hunks:
        lines = diff.new_side(hunk)
        function = (
            function_body(lines, signature)
            if not signature.startswith(" ")
            else member_body(lines, signature)
        )
        if function:
            return function
    raise AssertionError(f"no hunk of {name} covers {signature.strip()} in {path}")


def test_0003_describe_runtime_names_the_platform_version_before_the_topology_branch() -> None:
    function = _patched_function(SERIES[2], CLIENT_CPP, "std::string describe_runtime(")
    version = first_line(function, "client->platform_version()")
    topology = first_line(function, "GetTopologyDescription(")
    assert version is not None, "describe_runtime no longer names platform_version"
    assert topology is not None
    # At c04e61c the topology branch returned before the version: it must come first.
    assert version < topology
    assert function[version][1], "the platform_version must be an added line"


def test_0003_the_topology_branch_no_longer_returns_before_the_devices() -> None:
    function = _patched_function(SERIES[2], CLIENT_CPP, "std::string describe_runtime(")
    returns = [i for i, (text, _) in enumerate(function) if text.strip().startswith("return")]
    kind = first_line(function, "device->device_kind()")
    process = first_line(function, "process_index()")
    assert kind is not None and process is not None
    assert len(returns) == 1 and returns[0] > process, "a return skips the devices"
    hashed = _patched_function(SERIES[2], CLIENT_CPP, "torch::lazy::hash_t hash_comp_env(")
    assert first_line(hashed, "describe_runtime(client, ordered_devices)") is not None


def test_0003_custom_options_are_hashed_once_in_the_setter_under_a_lock() -> None:
    key = _patched_function(
        SERIES[2], CLIENT_CPP, "torch::lazy::hash_t PjRtComputationClient::HashCompilationEnv("
    )
    key_body = "\n".join(text for text, _ in key)
    assert "custom_compile_options_)" not in key_body, "the key copies the map at each sync"
    assert "std::lock_guard<std::mutex> lock(custom_compile_options_mutex_);" in key_body
    assert "custom_compile_options_hash_" in key_body
    assert "hash::StableHloCompileEnabled()" in key_body
    assert "hash::ConvertShloToShardyEnabled()" in key_body
    setter = _patched_function(
        SERIES[2], CLIENT_CPP, "void PjRtComputationClient::SetCustomCompileOptions("
    )
    locked = first_line(setter, "lock_guard<std::mutex> lock(custom_compile_options_mutex_)")
    stored = first_line(setter, "custom_compile_options_hash_ = hash;")
    assert locked is not None and stored is not None and locked < stored


def test_0003_the_key_serializes_the_options_compile_builds() -> None:
    # Compile() takes its options from the one function the key serializes.
    client_added = load(SERIES[2]).file(CLIENT_CPP).added()
    assert any(
        line.strip() == "xla::CompileOptions compile_options = BuildCompileOptions(instance);"
        for line in client_added
    )
    inputs = _patched_function(
        SERIES[2], CLIENT_CPP, "PjRtComputationClient::PersistentCacheKeyInputs("
    )
    body = "\n".join(text for text, _ in inputs)
    assert "BuildCompileOptions(instance).ToProto()" in body
    assert "tsl::SerializeToStringDeterministic(*options," in body
    # Never the parser that stops the process on an unknown flag; the flags as the client
    # saw them at its creation (flag_snapshot_check runs this function).
    code = [line for line in load(SERIES[2]).file(CLIENT_CPP).added() if "//" not in line]
    assert not any("GetDebugOptionsFromFlags" in line for line in code)
    for reader in (
        "flag_snapshot_.xla_flags",
        "flag_snapshot_.libtpu_init_args",
        "flag_snapshot_.tpu_megacore",
        "flag_snapshot_.ChangedVariables()",
        "*debug_options_key_",
        "hash::StableHloCompileEnabled()",
        "hash::ConvertShloToShardyEnabled()",
        "runtime_description_",
    ):
        assert reader in body, reader
    # Compile() reads the switches through env_hash, as the key does.
    added = "\n".join(load(SERIES[2]).file(CLIENT_CPP).added())
    removed = "\n".join(load(SERIES[2]).file(CLIENT_CPP).removed())
    for variable in ("XLA_STABLEHLO_COMPILE", "CONVERT_SHLO_TO_SHARDY"):
        assert f'GetEnvBool("{variable}"' in removed, variable
        assert f'GetEnvBool("{variable}"' not in added, variable
    build = _patched_function(
        SERIES[2], CLIENT_CPP, "xla::CompileOptions PjRtComputationClient::BuildCompileOptions("
    )
    locked = first_line(build, "lock_guard<std::mutex> lock(custom_compile_options_mutex_)")
    sorted_ = first_line(build, "const std::map<std::string, std::string> sorted_options(")
    assert locked is not None and sorted_ is not None and locked < sorted_


def test_0003_disk_entries_are_keyed_on_the_lowered_module() -> None:
    patch = load(SERIES[2])
    # The hunk of Compile() that holds the lookup, in its patched order.
    executor_diff = patch.file(EXECUTOR_CPP)
    compile_ = next(
        lines
        for lines in map(executor_diff.new_side, executor_diff.hunks)
        if first_line(lines, "disk_key = PersistentCacheKey(") is not None
    )
    keyed = first_line(
        compile_, "disk_key = PersistentCacheKey(client, instances.front(), &writable);"
    )
    looked_up = first_line(compile_, "persistent_cache->Get(*disk_key)")
    compiled = first_line(compile_, "computations = client->Compile(std::move(instances));")
    added = first_line(compile_, "persistent_cache->Add(*disk_key,")
    assert None not in (keyed, looked_up, compiled, added)
    # The key is taken and compared before anything is compiled or loaded.
    assert keyed < looked_up < compiled < added  # type: ignore[operator]
    key = _patched_function(
        SERIES[2], EXECUTOR_CPP, "std::optional<std::string> PersistentCacheKey("
    )
    body = "\n".join(text for text, _ in key)
    for needed in (
        "runtime::cache_key::CanonicalHloText(",
        ".set_print_large_constants(true)",
        "client->PersistentCacheKeyInputs(instance)",
        "OPENXLA_GITREV",
        "runtime::cache_key::DiskKey(*inputs)",
    ):
        assert needed in body, needed
    # The in-memory index stays the IR graph hash, with what can change in a process.
    executor = "\n".join(patch.file(EXECUTOR_CPP).added())
    assert "{client->HashCompilationEnv(), HashLoweringSettings()," in executor
    assert "XlaHelpers::mat_mul_precision()" in executor
    assert "return new XLAGraphExecutor::MemoryCache(kMaxCacheSize);" in executor
    # No lowering file is touched: the module carries what the lowering reads.
    touched = set(patch.header.declared_files)
    for lowering in ("data_ops.cpp", "layout_manager.cpp", "random.cpp", "token_handler.cpp"):
        assert f"torch_xla/csrc/{lowering}" not in touched, lowering


def test_0003_auto_sharding_is_read_where_it_is_used() -> None:
    diff = load(SERIES[2]).file(EXECUTOR_CPP)
    static = "static const bool use_autosharding = ShardingUtil::GetAutoSharding();"
    assert any(static in line for line in diff.removed())
    assert not any(static in line for line in diff.added())
    assert any(
        line.strip() == "const bool use_autosharding = ShardingUtil::GetAutoSharding();"
        for line in diff.added()
    )


def test_0003_the_key_names_the_openxla_revision() -> None:
    patch = load(SERIES[2])
    executor = "\n".join(patch.file("torch_xla/csrc/xla_graph_executor.cpp").added())
    assert "torch::lazy::StringHash(OPENXLA_GITREV)" in executor
    assert "extern const char OPENXLA_GITREV[];" in patch.file("torch_xla/csrc/version.h").added()
    setup = "\n".join(patch.file("setup.py").added())
    assert "TORCH_XLA_OPENXLA_REVISION" in setup and "const char OPENXLA_GITREV[]" in setup


def test_0004_add_writes_through_a_renamed_temporary_file() -> None:
    add = _patched_function(SERIES[3], CACHE_H, "  TypePtr Add(K key, TypePtr obj) override {")
    assert first_line(add, "WriteAtomically(") is not None
    assert first_line(add, "std::ofstream") is None, "Add still writes the entry in place"
    write = _patched_function(SERIES[3], CACHE_H, "  void WriteAtomically(")
    created = first_line(write, "O_EXCL")
    footer = first_line(write, "WriteAll(fd, footer.data(), footer.size())")
    renamed = first_line(write, "::rename(tmp_path.c_str(), path.c_str())")
    assert created is not None and footer is not None and renamed is not None
    assert created < footer < renamed, "the footer must be in the file before the rename"


def test_0004_temporary_names_are_host_and_random_never_the_pid() -> None:
    # "<entry>.tmp.<pid>.<n>" came back after a crash in a container restarted with the
    # same pid and blocked the entry forever.
    name = _patched_function(SERIES[3], CACHE_H, "  bool NewTemporaryPath(")
    body = "\n".join(text for text, _ in name)
    assert "std::random_device" in body and "HostNameForPath()" in body
    assert "getpid" not in "\n".join(load(SERIES[3]).file(CACHE_H).added())
    # Crash leftovers are swept at a bounded rate, outside the cache's lock: an Add that
    # listed the directory under the lock was a network round trip on gcsfuse every time.
    add = _patched_function(SERIES[3], CACHE_H, "  TypePtr Add(K key, TypePtr obj) override {")
    swept = first_line(add, "MaybeRemoveStaleTemporaryFiles();")
    locked = first_line(add, "std::lock_guard<std::mutex> slock(lock_);")
    assert swept is not None and locked is not None and swept < locked
    listing = re.compile(r"(?<!Maybe)RemoveStaleTemporaryFiles\(")
    assert not [text for text, _ in add if listing.search(text)]


def test_0004_only_a_writer_removes_and_only_a_proven_corrupt_entry() -> None:
    read = _patched_function(SERIES[3], CACHE_H, "  ReadResult ReadEntry(")
    footer = first_line(read, "if (!HasValidFooter(contents)) {")
    corrupt = first_line(read, "ReportCorrupt(path, opened,")
    assert footer is not None and corrupt is not None and footer < corrupt
    # A failed read is reported, and nothing before the footer check removes anything.
    assert calls_in(read[:footer], "ReportReadFailure")
    assert not calls_in(read[:footer], "RemoveIfUnchanged")
    assert not calls_in(read[:footer], "ReportCorrupt")
    assert not calls_in(read[:footer], "unlink")
    # ReportCorrupt removes only when writable; nothing else in the lookup removes.
    report = _patched_function(SERIES[3], CACHE_H, "  void ReportCorrupt(")
    guard = first_line(report, "if (readonly_storage_) {")
    remove = first_line(report, "RemoveIfUnchanged(path, read_file);")
    assert guard is not None and remove is not None and guard < remove
    # Get's signature is unchanged context outside the hunks: its lookup is the hunk that
    # reads the entry.
    cache_diff = load(SERIES[3]).file(CACHE_H)
    get = next(
        lines
        for lines in map(cache_diff.new_side, cache_diff.hunks)
        if first_line(lines, "ReadResult read = ReadEntry(path, &serialization, &read_file);")
        is not None
    )
    assert not calls_in(get, "EraseImpl") and not calls_in(get, "RemoveIfUnchanged")


def test_0004_a_read_only_cache_neither_creates_nor_deletes() -> None:
    patch = load(SERIES[3]).file(CACHE_H)
    added = "\n".join(patch.added())
    # The constructor's create_directories is now behind the read-only flag ...
    assert re.search(
        r"if \(!readonly_storage_\) \{\s*std::error_code error;\s*"
        r"std::filesystem::create_directories\(cache_dir_, error\);",
        added,
    )
    assert "    std::filesystem::create_directories(cache_dir);" in patch.removed()
    # ... and EraseImpl returns before touching the disk, deleting without throwing.
    erase = _patched_function(SERIES[3], CACHE_H, "  bool EraseImpl(const K& key) {")
    guard = first_line(erase, "if (readonly_storage_)")
    remove = first_line(erase, "std::filesystem::remove(GetPath(key), error)")
    assert guard is not None and remove is not None and guard < remove


def test_0004_the_sweep_matches_only_the_caches_own_temporary_names() -> None:
    sweep = _patched_function(SERIES[3], CACHE_H, "  void RemoveStaleTemporaryFiles(")
    assert first_line(sweep, "if (!IsTemporaryFileName(name)) {") is not None
    assert first_line(sweep, 'name.find(".tmp.")') is None
    # Nothing of the removed verify hook is left.
    cache = "\n".join(load(SERIES[3]).file(CACHE_H).added())
    assert "accept" not in cache and "PersistentCacheVerifyMismatch" not in cache


def test_0005_the_custom_call_hash_seeds_every_lowered_attribute() -> None:
    path = "torch_xla/csrc/ops/custom_call.cpp"
    diff = load(SERIES[4]).file(path)
    assert any("torch::lazy::MHash(call_target))," in line for line in diff.removed())
    added = "\n".join(diff.added())
    assert "CustomCallHashSeed(call_target, has_side_effect, backend_config," in added
    clone = _patched_function(SERIES[4], path, "torch::lazy::NodePtr CustomCall::Clone(")
    assert first_line(clone, "backend_config_, api_version_, frontend_attributes_);") is not None


# --- Against the real source (tests/real_source.py: base_tree, patched_tree) ---------------
# Each test below needs the real pytorch/xla source: without one it skips and says why; in
# CI with the shared snapshot present a skip is a failure (tests/conftest.py).


def test_series_applies_to_the_real_base_one_commit_per_patch(
    base_tree: Path, patched_tree: Path
) -> None:
    # The patched_tree fixture applied each patch with `git apply --whitespace=error-all`.
    subjects = git(patched_tree, "log", "--format=%s", f"{BASE}..HEAD").splitlines()
    assert subjects == [load(name).header.fields["Subject"] for name in reversed(SERIES)]
    touched: set[str] = set()
    for name in SERIES:
        declared = load(name).header.declared_files
        touched.update(declared)
        for path in declared:
            # The tab rule above assumes the files use none; make sure they really don't
            # (a file the series adds: in the patched tree).
            source = base_tree / path if (base_tree / path).exists() else patched_tree / path
            assert "\t" not in source.read_text(encoding="utf-8"), path
    changed = git(patched_tree, "diff", "--name-only", BASE, "HEAD").split()
    assert sorted(changed) == sorted(touched)
    patched = (patched_tree / "torch_xla/csrc/init_python_bindings.cpp").read_text("utf-8")
    assert patched.count('"_xla_runtime_memory_info"') == 1
    # The whole patched hash_comp_env, not just the hunk: platform_version before any return.
    client = [(line, False) for line in (patched_tree / CLIENT_CPP).read_text().split("\n")]
    runtime = function_body(client, "std::string describe_runtime(")
    version = first_line(runtime, "client->platform_version()")
    returns = [i for i, (text, _) in enumerate(runtime) if text.strip().startswith("return")]
    assert version is not None and returns and version < min(returns)
    cache = (patched_tree / CACHE_H).read_text(encoding="utf-8")
    assert "std::ofstream out(path" not in cache


def test_git_blame_on_the_patched_tree_names_the_patch(patched_tree: Path) -> None:
    """What maps a compile error's line back to its patch: one commit per patch."""
    lines = (patched_tree / CACHE_H).read_text(encoding="utf-8").split("\n")
    number = next(i for i, line in enumerate(lines, 1) if "WriteAtomically(" in line)
    blame = git(patched_tree, "blame", "--porcelain", f"-L{number},{number}", "--", CACHE_H)
    summary = next(line for line in blame.splitlines() if line.startswith("summary "))
    assert summary == "summary " + load(SERIES[3]).header.fields["Subject"]


# --- Compiled checks of the series (xla_wheels.series_checks) -------------------------------


@pytest.fixture(scope="module")
def patched_outcomes(
    series_toolchain: Toolchain, patched_tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, CheckOutcome]:
    work = tmp_path_factory.mktemp("series-checks-patched")
    return {o.program: o for o in run_series_checks(patched_tree, series_toolchain, work)}


@pytest.fixture(scope="module")
def base_outcomes(
    series_toolchain: Toolchain, base_tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, CheckOutcome]:
    # Only the series' own checks, whose failures at base are what the tests compare;
    # upstream's C++ tests are asserted on the patched tree alone.
    work = tmp_path_factory.mktemp("series-checks-base")
    programs = (
        LOAD_CHECK,
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
        RUNTIME_MEMORY_CHECK,
    )
    return {o.program: o for o in run_series_checks(base_tree, series_toolchain, work, programs)}


def _compiled(outcome: CheckOutcome) -> dict[str, str]:
    assert not outcome.compile_errors, (outcome.compile_errors, outcome.output[-4000:])
    return outcome.verdicts


def _cannot_build_naming(outcome: CheckOutcome, path: str, name: str) -> None:
    assert not outcome.verdicts
    [error] = outcome.compile_errors
    assert error.path == path and name in error.message, error


def test_0003_comp_env_checks_pass_patched_and_cannot_build_at_base(
    patched_outcomes: dict[str, CheckOutcome], base_outcomes: dict[str, CheckOutcome]
) -> None:
    patched = _compiled(patched_outcomes["comp_env_hash_check"])
    assert patched == dict.fromkeys(patched, "PASS")
    assert set(patched) == {
        "platform_version_in_both_branches",
        "devices_in_both_branches",
        "custom_options_change_the_key",
        "custom_options_are_hashed_in_sorted_order",
        "libtpu_flags_change_the_key",
        "per_compile_switches_change_the_key",
        "switches_are_hashed_as_read",
        "logging_flags_stay_out_of_the_key",
    }
    # c04e61c has no describe_runtime: the platform and devices were hashed by
    # hash_comp_env alone, and only without a topology.
    _cannot_build_naming(base_outcomes["comp_env_hash_check"], CLIENT_CPP, "describe_runtime(")


def test_0003_cache_key_checks_pass_patched_and_cannot_build_at_base(
    patched_outcomes: dict[str, CheckOutcome], base_outcomes: dict[str, CheckOutcome]
) -> None:
    assert _compiled(patched_outcomes["cache_key_check"]) == {
        "table_cases_hold": "PASS",
        "canonical_text_equals_the_python_rules": "PASS",
        "every_input_changes_the_key": "PASS",
        "inputs_cannot_run_into_each_other": "PASS",
        "module_key_follows_the_canonical_text": "PASS",
        "disk_key_is_the_sha256_of_the_stream": "PASS",
    }
    base = base_outcomes["cache_key_check"]
    assert not base.verdicts
    assert "torch_xla/csrc/runtime/cache_key.h" in base.compile_errors[0].message


def test_0003_flags_are_read_as_xla_reads_them_patched_not_at_base(
    patched_outcomes: dict[str, CheckOutcome], base_outcomes: dict[str, CheckOutcome]
) -> None:
    patched = _compiled(patched_outcomes["xla_flags_check"])
    assert patched == dict.fromkeys(patched, "PASS") and len(patched) == 10
    # c04e61c keeps space-separated tokens starting with --xla, sorted: a flag file's
    # path (no --xla) is dropped, duplicates lose their order, a quoted value is cut, a
    # "--flag value" form loses its value, --noflag and --flag=true in either order are
    # one key, and only its own list of dump flags stays out.
    assert set(_compiled(base_outcomes["xla_flags_check"])) == set(patched)
    assert set(base_outcomes["xla_flags_check"].failed) == {
        "flag_file_is_read",
        "flag_file_equals_its_flags_inline",
        "unreadable_flag_file_is_not_no_flags",
        "last_flag_wins",
        "quoted_value_is_one_flag",
        "parsing_stops_where_xla_stops",
        "libtpu_args_are_read_to_the_end",
        "libtpu_negation_order_is_keyed",
        "libtpu_dump_flags_stay_out",
    }


def test_0003_flag_parts_of_the_key_pass_patched_and_cannot_build_at_base(
    patched_outcomes: dict[str, CheckOutcome], base_outcomes: dict[str, CheckOutcome]
) -> None:
    assert _compiled(patched_outcomes["flag_snapshot_check"]) == {
        "key_holds_the_flags_at_client_creation": "PASS",
        "changed_flags_write_no_entry_naming_the_variable": "PASS",
        "unknown_xla_flag_does_not_stop_the_process": "PASS",
        "unparsable_xla_flags_turn_the_cache_off": "PASS",
        "every_dump_field_is_cleared": "PASS",
        "options_failure_is_an_error": "PASS",
    }
    # c04e61c (and the series before the snapshot) has no ClearDebugOptionsOutsideKey:
    # the key read the flags at every compile through GetDebugOptionsFromFlags.
    _cannot_build_naming(
        base_outcomes["flag_snapshot_check"], CLIENT_CPP, "ClearDebugOptionsOutsideKey("
    )


def test_0003_a_failure_while_keying_skips_the_cache_patched_not_at_base(
    patched_outcomes: dict[str, CheckOutcome], base_outcomes: dict[str, CheckOutcome]
) -> None:
    assert _compiled(patched_outcomes["persistent_cache_key_check"]) == {
        "keying_failure_skips_the_cache_counted": "PASS",
        "good_graph_is_keyed_and_writable": "PASS",
        "changed_flags_are_keyed_but_not_written": "PASS",
    }
    _cannot_build_naming(
        base_outcomes["persistent_cache_key_check"], EXECUTOR_CPP, "WarnPersistentCacheOnce("
    )


def test_0005_custom_call_hash_check_passes_patched_and_cannot_build_at_base(
    patched_outcomes: dict[str, CheckOutcome], base_outcomes: dict[str, CheckOutcome]
) -> None:
    assert _compiled(patched_outcomes["custom_call_hash_check"]) == {
        "frontend_attributes_change_the_hash": "PASS",
        "every_attribute_of_the_call_changes_the_hash": "PASS",
        "attribute_order_does_not_matter": "PASS",
    }
    _cannot_build_naming(
        base_outcomes["custom_call_hash_check"],
        "torch_xla/csrc/ops/custom_call.cpp",
        "CustomCallHashSeed(",
    )


def test_0003_matmul_precision_check_passes_patched_and_cannot_build_at_base(
    patched_outcomes: dict[str, CheckOutcome], base_outcomes: dict[str, CheckOutcome]
) -> None:
    assert _compiled(patched_outcomes["lowering_key_check"]) == {
        "matmul_precision_changes_the_key": "PASS",
        "key_follows_the_precision_at_every_sync": "PASS",
    }
    # c04e61c (and the series before the precision was keyed) has no HashLoweringSettings:
    # the precision is in no key, and the check says which function is missing.
    base = base_outcomes["lowering_key_check"]
    assert not base.verdicts
    [error] = base.compile_errors
    assert error.path == "torch_xla/csrc/xla_graph_executor.cpp"
    assert "HashLoweringSettings(" in error.message


def test_0001_load_checks_pass_patched_and_fail_at_base(
    patched_outcomes: dict[str, CheckOutcome], base_outcomes: dict[str, CheckOutcome]
) -> None:
    patched = _compiled(patched_outcomes["load_check"])
    assert patched == dict.fromkeys(patched, "PASS")
    assert len(patched) == 5
    _compiled(base_outcomes["load_check"])
    # c04e61c never tries LoadSerializedExecutable; the earlier 0001 failed only the
    # INVALID_ARGUMENT case (its fallback was taken on UNIMPLEMENTED alone).
    assert set(base_outcomes["load_check"].failed) == {
        "one_step_load_is_used_when_it_works",
        "unimplemented_falls_back_to_two_steps",
        "invalid_argument_falls_back_to_two_steps",
        "both_paths_failing_is_a_miss_not_a_crash",
    }


def test_0003_custom_options_setter_and_key_are_race_free(
    patched_outcomes: dict[str, CheckOutcome], base_outcomes: dict[str, CheckOutcome]
) -> None:
    assert _compiled(patched_outcomes["custom_options_race_check"]) == {
        "setter_and_key_share_a_lock": "PASS"
    }
    # c04e61c's key ignores the options (no race to find, but no lock either); the
    # program shares the key functions' extraction with comp_env_hash_check, so it does
    # not build there.
    _cannot_build_naming(
        base_outcomes["custom_options_race_check"], CLIENT_CPP, "describe_runtime("
    )


def test_0004_persistent_cache_checks_pass_patched_and_fail_at_base(
    patched_outcomes: dict[str, CheckOutcome], base_outcomes: dict[str, CheckOutcome]
) -> None:
    patched = _compiled(patched_outcomes["persistent_cache_check"])
    assert patched == dict.fromkeys(patched, "PASS")
    assert len(patched) == 23
    _compiled(base_outcomes["persistent_cache_check"])
    failed = set(base_outcomes["persistent_cache_check"].failed)
    # Whether the in-place write is caught mid-way is a race, though it usually wins here.
    racy = {"no_reader_sees_a_partial_entry", "concurrent_readers_never_load_a_partial_entry"}
    # A memory size of 0 is undefined behaviour at c04e61c (Cache returns an element it has
    # just evicted): without a sanitizer it may pass; persistent_cache_asan_check judges it.
    racy.add("memory_size_zero_keeps_no_reference")
    # Passing at base too: crash_leftover_does_not_block_saving (the in-place write has no
    # temporary name; the pid-named one of an earlier 0004 failed it) and
    # adds_do_not_list_the_directory (c04e61c lists nothing; the previous 0004 listed the
    # directory on every Add).
    assert failed - racy == {
        "reader_creates_nothing",
        "failed_delete_does_not_throw",
        "failed_write_is_counted_not_thrown",
        "uncreatable_directory_does_not_throw",
        "entry_is_the_value_and_a_footer",
        "temporary_names_carry_host_and_random_part",
        "stale_temporary_files_are_removed_when_a_writer_starts",
        "sweep_removes_only_the_caches_own_temporary_names",
        "truncated_entry_is_a_miss_removed_only_by_a_writer",
        "damaged_entry_is_a_miss",
        "failed_read_is_a_miss_and_deletes_nothing",
        "failed_serialization_is_counted_not_thrown",
        "intact_entry_that_fails_to_load_is_kept_then_replaced",
        "entry_whose_load_throws_does_not_block_saving",
        "finished_write_is_durable_before_it_is_visible",
    }
    assert _compiled(patched_outcomes["persistent_cache_asan_check"]) == {
        "memory_size_zero_keeps_no_reference": "PASS"
    }
    # At c04e61c AddressSanitizer stops the check at the use of the evicted element.
    asan_base = _compiled(base_outcomes["persistent_cache_asan_check"])
    assert asan_base["memory_size_zero_keeps_no_reference"].startswith(
        "the check's process died"
    ), asan_base


def test_0002_runtime_memory_checks_pass_patched_and_fail_at_base(
    patched_outcomes: dict[str, CheckOutcome], base_outcomes: dict[str, CheckOutcome]
) -> None:
    patched = _compiled(patched_outcomes["runtime_memory_check"])
    assert patched == {
        "local_device_answers": "PASS",
        "another_hosts_device_is_refused_pointing_at_the_local_list": "PASS",
        "spmd_virtual_device_is_refused": "PASS",
        "unknown_device_is_refused_listing_the_valid_ones": "PASS",
    }
    # c04e61c has no GetRuntimeMemoryInfo.
    base = base_outcomes["runtime_memory_check"]
    assert not base.verdicts
    assert "GetRuntimeMemoryInfo" in base.compile_errors[0].message


@pytest.mark.parametrize(
    ("program", "tests"),
    [
        ("cache_test", {"UtilTest.XlaUtilCacheTest", "UtilTest.XlaUtilPersistentCacheTest"}),
        ("env_hash_test", {"HashTest.CompilationEnvHashTest"}),
    ],
)
def test_upstream_cpp_tests_pass_on_the_patched_tree(
    program: str, tests: set[str], patched_outcomes: dict[str, CheckOutcome]
) -> None:
    verdicts = _compiled(patched_outcomes[program])
    assert verdicts == dict.fromkeys(tests, "PASS")


def test_the_cache_h_check_needs_no_absl(
    series_toolchain: Toolchain, patched_tree: Path, tmp_path: Path
) -> None:
    # Proven by building it with absl's prefix pointing at an empty directory.
    assert not PERSISTENT_CACHE_CHECK.needs_absl
    nowhere = tmp_path / "no-absl"
    nowhere.mkdir()
    without_absl = replace(series_toolchain, absl=Prefix(nowhere, nowhere))
    [outcome] = run_series_checks(
        patched_tree, without_absl, tmp_path / "work", (PERSISTENT_CACHE_CHECK,)
    )
    verdicts = _compiled(outcome)
    assert verdicts == dict.fromkeys(verdicts, "PASS") and len(verdicts) == 23


def _clang_format_14() -> Path:
    """clang-format 14 (the version the patched files are formatted with): the PyPI
    package of requirements-dev.txt, beside this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "clang-format"
    found = str(beside) if beside.is_file() else shutil.which("clang-format")
    assert found, "clang-format is not installed: it is in requirements-dev.txt (make venv)"
    version = subprocess.run([found, "--version"], text=True, capture_output=True).stdout
    assert re.search(r"version 14\.", version), f"{found} is not clang-format 14: {version}"
    return Path(found)


def test_patched_files_are_clang_format_clean(patched_tree: Path) -> None:
    formatter = _clang_format_14()
    touched = sorted({path for name in SERIES for path in load(name).header.declared_files})
    sources = [path for path in touched if path.endswith((".cpp", ".h"))]
    assert sources, "the series touches no C++ file: drop this test"
    for path in sources:
        formatted = subprocess.run(
            [str(formatter), "--style=file", path],
            cwd=patched_tree,
            text=True,
            capture_output=True,
            check=True,
        ).stdout
        assert formatted == (patched_tree / path).read_text(encoding="utf-8"), path


def test_patched_python_files_are_yapf_clean(patched_tree: Path) -> None:
    # pytorch/xla's lint workflow formats Python with yapf 0.40.2 and its .style.yapf.
    touched = sorted({path for name in SERIES for path in load(name).header.declared_files})
    python_files = [path for path in touched if path.endswith(".py")]
    assert python_files, "the series touches no Python file: drop this test"
    checked = subprocess.run(
        [sys.executable, "-m", "yapf", "--diff", *python_files],
        cwd=patched_tree,
        text=True,
        capture_output=True,
        check=False,
    )
    assert checked.returncode == 0 and not checked.stdout, checked.stdout + checked.stderr
