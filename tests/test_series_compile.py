"""series-compile: the series' translation units, base and patched, against real XLA headers.

The unit tests pin down which units are compiled (from the diff and the include graph of
a small tree of their own) and how an error is keyed. The real-source tests compile the
real pytorch/xla tree at c04e61c, with the series and with a copy of it holding planted
mistakes, against the tf-2.20 header set (tensorflow-cpu 2.20.0's XLA headers, torch
2.9.0's, Debian's llvm-21-dev), unpacked once per machine in the per-machine cache; the
error sets are cached there by content, so a second run compiles nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import clirunner, real_source
from tests.bundles import LIBTPU_RUNTIME, Pin, write_bundle
from tests.gitrepos import git, make_repo
from tests.missing_tools import skip_missing
from xla_host.net import NetworkPolicy
from xla_wheels.options import machine_cache
from xla_wheels.series_checks.unit_compile import (
    COMPILE_TIMEOUT_S,
    SeriesCompileReport,
    UnitError,
    UnitResult,
    closure,
    compile_series,
    include_graph,
    parse_errors,
    stand_in_text,
    touched_units,
)
from xla_wheels.series_checks.xla_headers import HEADER_SETS, Headers, ensure_headers

CSRC = "torch_xla/csrc"
PATCH_0003 = "0003-cache-key-covers-compile-options.patch"
#: The units the series changes itself, the small ones: a planted mistake is compiled
#: in these (the larger units are compiled by the real-series test).
SMALL_UNITS = (f"{CSRC}/runtime/env_hash.cpp", f"{CSRC}/runtime/cache_key.cpp")
#: The .cpp files the series' diff changes (or adds).
CHANGED_UNITS = (
    f"{CSRC}/init_python_bindings.cpp",
    f"{CSRC}/ops/custom_call.cpp",
    f"{CSRC}/runtime/cache_key.cpp",
    f"{CSRC}/runtime/env_hash.cpp",
    f"{CSRC}/runtime/pjrt_computation_client.cpp",
    f"{CSRC}/xla_graph_executor.cpp",
)


def _write(tree: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)


# --- which units ----------------------------------------------------------------------------


def test_a_changed_header_brings_in_every_unit_that_includes_it_directly_or_not(
    tmp_path: Path,
) -> None:
    _write(tmp_path, {
        f"{CSRC}/a.h": "int a();\n",
        f"{CSRC}/b.h": '#include "torch_xla/csrc/a.h"\n',
        f"{CSRC}/uses_b.cpp": '#include "torch_xla/csrc/b.h"\n',
        f"{CSRC}/runtime/c.h": "int c();\n",
        f"{CSRC}/runtime/uses_c.cpp": '#include "c.h"\n',  # relative to its own directory
        f"{CSRC}/unrelated.cpp": "#include <vector>\n",
    })  # fmt: skip
    graph = include_graph(tmp_path)
    assert closure(f"{CSRC}/uses_b.cpp", graph) == [
        f"{CSRC}/a.h", f"{CSRC}/b.h", f"{CSRC}/uses_b.cpp"
    ]  # fmt: skip
    assert touched_units(tmp_path, [f"{CSRC}/a.h"]) == [f"{CSRC}/uses_b.cpp"]
    assert touched_units(tmp_path, [f"{CSRC}/runtime/c.h", f"{CSRC}/unrelated.cpp"]) == [
        f"{CSRC}/runtime/uses_c.cpp", f"{CSRC}/unrelated.cpp"
    ]  # fmt: skip
    assert touched_units(tmp_path, ["setup.py"]) == []


def test_an_error_is_keyed_on_its_file_line_text_and_message_not_its_number(
    tmp_path: Path,
) -> None:
    headers = Headers(tmp_path / "headers", HEADER_SETS["tf-2.20"], "id")
    _write(tmp_path, {f"{CSRC}/x.cpp": "int a;\n  f(1);\n"})
    stderr = (
        f"{CSRC}/x.cpp:2:3: error: 'f' was not declared in this scope\n"
        f"{CSRC}/x.cpp:2:3: note: something g++ adds\n"
    )
    (error,) = parse_errors(stderr, tmp_path, headers, tmp_path / "stand-ins")
    assert error == UnitError(f"{CSRC}/x.cpp", "f(1);", "'f' was not declared in this scope", 2)
    moved = UnitError(error.path, error.text, error.message, 40)
    assert moved.key == error.key, "code moved by a patch is the same error"


def test_a_unit_g_plus_plus_stopped_in_is_not_checked_and_never_passes(tmp_path: Path) -> None:
    headers = Headers(tmp_path / "headers", HEADER_SETS["tf-2.20"], "id")
    _write(tmp_path, {f"{CSRC}/x.cpp": "#include <Python.h>\n"})
    stderr = f"{CSRC}/x.cpp:1:10: fatal error: Python.h: No such file or directory\n"
    errors = parse_errors(stderr, tmp_path, headers, tmp_path / "stand-ins")
    assert errors[0].fatal
    same = UnitResult(f"{CSRC}/x.cpp", errors, cached=False)
    report = SeriesCompileReport((same.unit,), (same,), (same,), (), (), headers)
    assert not report.passed, "identical errors of a unit never compiled prove nothing"
    assert report.lines()[0] == (
        f"NOT CHECKED {CSRC}/x.cpp: g++ did not get through it "
        f"({CSRC}/x.cpp:1: Python.h: No such file or directory)"
    )


def test_a_stand_in_declares_the_coordinators_classes() -> None:
    text = stand_in_text("xla/pjrt/distributed/distributed.h")
    assert "#pragma once" in text and "class DistributedRuntimeClient;" in text
    assert "class" not in stand_in_text("xla/python/ifrt/hlo/hlo_program.h").split("once")[1]


# --- the real tree against real headers ----------------------------------------------------


@pytest.fixture(scope="module")
def headers() -> Headers:
    if shutil.which("g++") is None:
        skip_missing("g++ (Debian: apt-get install g++; make compiler-tools installs it)")
    return ensure_headers(machine_cache(os.environ), HEADER_SETS["tf-2.20"], NetworkPolicy())


def _planted_series(dest: Path, plants: dict[str, list[tuple[str, str]]]) -> list[Path]:
    """A copy of the series with each (old, new) of ``plants[patch]`` replaced once."""
    dest.mkdir()
    copies = []
    for patch in real_source.series_patches():
        text = patch.read_text(encoding="utf-8")
        for old, new in plants.get(patch.name, []):
            assert text.count(old) == 1, f"{old!r} is not one line of {patch.name}"
            text = text.replace(old, new)
        (dest / patch.name).write_text(text, encoding="utf-8")
        copies.append(dest / patch.name)
    return copies


def _series_tree(repo: Path, dest: Path, patches: list[Path]) -> tuple[Path, dict[str, str]]:
    tree = real_source.worktree(repo, dest, real_source.BASE)
    commits = real_source.apply_series(tree, patches)
    return tree, {c: f"torch_xla/{p.name}" for c, p in zip(commits, patches, strict=True)}


def _line_of(tree: Path, path: str, text: str) -> int:
    lines = (tree / path).read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line)


PLANTS = [
    # (what is planted, the file, the text of its line, what g++ must say)
    ("a dropped argument", "cache_key.cpp",
     "+  return text.compare(at, std::char_traits<char>::length(prefix), prefix) == 0;",
     "+  return text.compare(std::char_traits<char>::length(prefix), prefix) == 0;",
     "no matching function for call to"),
    ("a misspelt member", "env_hash.cpp",
     "+      flags.push_back(flag);", "+      flags.push_bak(flag);",
     "has no member named 'push_bak'"),
    ("a wrong member", "cache_key.cpp",
     '+  const size_t begin = line.find_first_not_of(" \\t\\r");',
     '+  const size_t begin = line.find_first_not(" \\t\\r");',
     "has no member named 'find_first_not'"),
]  # fmt: skip


@pytest.fixture(scope="module")
def planted_report(
    headers: Headers,
    pytorch_xla_repo: Path,
    base_tree: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[SeriesCompileReport, Path]:
    work = tmp_path_factory.mktemp("series-compile-planted")
    patches = _planted_series(
        work / "series", {PATCH_0003: [(old, new) for _, _, old, new, _ in PLANTS]}
    )
    tree, commits = _series_tree(pytorch_xla_repo, work / "xla", patches)
    report = compile_series(
        base_tree, tree, commits, headers, machine_cache(os.environ), work / "compile",
        units=SMALL_UNITS,
    )  # fmt: skip
    return report, tree


@pytest.mark.slow
@pytest.mark.parametrize("what, file, old, new, message", PLANTS, ids=[p[0] for p in PLANTS])
def test_each_planted_mistake_is_reported_at_its_line_with_its_patch(
    planted_report: tuple[SeriesCompileReport, Path],
    what: str, file: str, old: str, new: str, message: str,
) -> None:  # fmt: skip
    report, tree = planted_report
    path = f"{CSRC}/runtime/{file}"
    line = _line_of(tree, path, new[1:].strip())
    found = [e for e in report.new_errors if e.error.path == path and e.error.line == line]
    assert found, f"{what} at {path}:{line} not reported; new: {report.new_errors}"
    assert found[0].patch == f"torch_xla/{PATCH_0003}"
    assert message in found[0].error.message
    rendered = "\n".join(report.lines())
    assert f"patches/torch_xla/{PATCH_0003}: {path}:{line}: " in rendered
    assert not report.passed


@pytest.mark.slow
def test_the_real_series_adds_no_error_to_the_units_it_changes(
    headers: Headers, base_tree: Path, patched_tree: Path, tmp_path: Path
) -> None:
    commits = git(patched_tree, "rev-list", "--reverse", f"{real_source.BASE}..HEAD").split()
    patches = real_source.series_patches()
    report = compile_series(
        base_tree, patched_tree,
        {c: f"torch_xla/{p.name}" for c, p in zip(commits, patches, strict=True)},
        headers, machine_cache(os.environ), tmp_path, units=CHANGED_UNITS,
    )  # fmt: skip
    assert report.units == tuple(sorted(CHANGED_UNITS))
    assert report.passed, "\n".join(report.lines())
    text = "\n".join(report.lines())
    assert "not proven: not the pinned OpenXLA itself" in text
    assert "g++, not upstream's clang 17" in text and "nothing is linked" in text
    # The distributed runtime's header is one the wheel lacks: a stand-in, and said so.
    assert "xla/pjrt/distributed/distributed.h" in report.stand_ins
    # torch_xla's generated code is generated (torchgen), not stood in for.
    assert not [name for name in report.stand_ins if "XLANativeFunctions" in name]


@pytest.mark.slow
def test_a_second_run_compiles_nothing(
    headers: Headers, planted_report: tuple[SeriesCompileReport, Path], base_tree: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    first, tree = planted_report
    commits = dict.fromkeys(
        git(tree, "rev-list", f"{real_source.BASE}..HEAD").split(), "torch_xla/x.patch"
    )
    again = compile_series(
        base_tree, tree, commits, headers, machine_cache(os.environ), tmp_path, units=SMALL_UNITS
    )
    assert all(result.cached for result in (*again.base, *again.patched))
    assert [e.error for e in again.new_errors] == [e.error for e in first.new_errors]


@pytest.mark.slow
def test_the_header_set_holds_what_the_wheel_lacks_nothing_of_torchs_protobuf(
    headers: Headers,
) -> None:
    assert (headers.root / "xla" / "xla" / "pjrt" / "pjrt_client.h").is_file()
    assert (headers.root / "llvm" / "llvm-21" / "llvm" / "ADT" / "StringRef.h").is_file()
    assert (headers.root / "torch" / "torch" / "csrc" / "lazy" / "core" / "hash.h").is_file()
    assert not (headers.root / "torch" / "google").exists()
    assert not (headers.root / "xla" / "xla" / "pjrt" / "distributed" / "distributed.h").exists()
    assert subprocess.run(["g++", "--version"], capture_output=True).returncode == 0


PROBE = f"{CSRC}/runtime/series_compile_probe.cpp"
PROBE_LINES = [
    '#include "torch_xla/csrc/runtime/env_hash.h"',
    "",
    "namespace torch_xla::runtime::hash {",
    "torch::lazy::hash_t Probe() {",
    "  return HashXlaEnvVars(1);  // planted: an extra argument",
    "}",
    "}  // namespace torch_xla::runtime::hash",
]


def _probe_patch() -> str:
    """A one-patch series adding one unit with a planted mistake at its line 5."""
    header = "\n".join([
        "Subject: A probe unit for series-compile's command-line test",
        "Component: torch_xla",
        f"Base: {real_source.BASE}",
        "Fixes: nothing (a test)",
        "Why: a unit the series adds, with one planted mistake",
        "Upstream: not upstreamed",
        f"Files: {PROBE}",
    ])  # fmt: skip
    body = "".join(f"+{line}\n" for line in PROBE_LINES)
    return (
        f"{header}\n\ndiff --git a/{PROBE} b/{PROBE}\nnew file mode 100644\n"
        f"--- /dev/null\n+++ b/{PROBE}\n@@ -0,0 +1,{len(PROBE_LINES)} @@\n{body}"
    )


@pytest.mark.slow
def test_the_command_fails_naming_the_patch_file_line_and_message(
    headers: Headers, tmp_path: Path, pytorch_xla_repo: Path
) -> None:
    project = tmp_path / "project"
    (project / "patches" / "torch_xla").mkdir(parents=True)
    (project / "patches" / "torch_xla" / "0001-probe.patch").write_text(_probe_patch())
    stand_in = make_repo(tmp_path / "stand-in", {"README": "stand-in\n"})  # never fetched
    write_bundle(
        project,
        "probe",
        {
            "torch": Pin("https://github.com/pytorch/pytorch.git", stand_in, "2.9.0"),
            "torch_xla": Pin(
                "https://github.com/pytorch/xla.git", real_source.BASE, "2.9.0",
                ["torch_xla/0001-probe.patch"],
            ),
            "openxla": Pin("https://github.com/openxla/xla.git", stand_in),
        },
        runtime=LIBTPU_RUNTIME,
    )  # fmt: skip
    # The machine cache's header set (the fixture made it); a home of its own; the
    # compile limit's time, not run_cli's.
    result = clirunner.run_cli(
        "series-compile", "--bundle", "probe", "--source", str(pytorch_xla_repo), root=project,
        env={"XLA_WHEELS_CACHE": str(machine_cache(os.environ)), "HOME": str(tmp_path / "home")},
        timeout=COMPILE_TIMEOUT_S * 2,
    )  # fmt: skip
    assert result.exit_code == 7, result.output
    assert f"FAIL {PROBE}: 0 error(s) at base, 1 patched, 1 new" in result.stdout
    assert (
        f"patches/torch_xla/0001-probe.patch: {PROBE}:5: too many arguments to function"
        in result.stdout
    ), result.stdout
    assert "not proven: not the pinned OpenXLA itself" in result.stdout
    assert "error: the torch_xla series of probe: the patched tree adds 1 compile error(s)" in (
        result.stderr
    )
    assert "fix: " in result.stderr and "Traceback" not in result.output
