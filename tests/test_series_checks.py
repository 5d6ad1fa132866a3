"""xla_wheels.series_checks: the toolchain it sets up, the programs it builds, what it reports.

The toolchain tests download real Debian packages (a few hundred KB) into a scratch cache.
The program tests build small programs of their own with the real toolchain, against a
small tree of their own (to pin down how a g++ error is reported) and against the real
pytorch/xla source at c04e61c and v2.9.0 (the member check that tells "applies" from
"builds"). The series' own programs are exercised in tests/test_torch_xla_patches.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from tests import real_source
from tests.gitrepos import REPO_ROOT, git
from tests.missing_tools import skip_missing
from xla_host.errors import ToolchainError
from xla_host.gate.hlo_canonical import canonical_text
from xla_host.net import NetworkPolicy
from xla_wheels.series_checks.build_deps import BuildFileError, external_deps, torch_libraries
from xla_wheels.series_checks.programs import (
    CANONICAL_CASES_TABLE,
    CLIENT_H,
    UPSTREAM_CACHE_TEST,
    CheckProgram,
    Function,
    Members,
    StdIncludes,
    canonical_cases_text,
    generate,
)
from xla_wheels.series_checks.run import (
    PROGRAM_VERDICT,
    CheckOutcome,
    CompileError,
    parse_compile_errors,
    run_series_checks,
)
from xla_wheels.series_checks.toolchain import (
    BOOKWORM_PACKAGES,
    MARKER,
    CompilerCache,
    Toolchain,
    compiler_cache,
    download,
    ensure_debian_root,
    root_name,
)

GTEST_PACKAGES = tuple(p for p in BOOKWORM_PACKAGES if p.name in ("libgtest-dev", "libgmock-dev"))


# --- Debian packages into the cache ----------------------------------------------------------


def test_a_corrupt_pin_is_refused_naming_the_url_and_both_hashes(tmp_path: Path) -> None:
    package = replace(GTEST_PACKAGES[0], sha256="0" * 64)
    with pytest.raises(ToolchainError) as raised:
        download(package, tmp_path / "debs", NetworkPolicy())
    assert f"{package.url} has sha256 " in raised.value.message
    assert f"not the pinned {'0' * 64}" in raised.value.message
    assert "apt-cache show libgtest-dev" in (raised.value.fix or "")
    assert raised.value.exit_code == 2
    assert list((tmp_path / "debs").iterdir()) == [], "nothing unverified is kept"


def test_a_failed_download_names_the_url_and_a_fix(tmp_path: Path) -> None:
    package = replace(GTEST_PACKAGES[0], url=GTEST_PACKAGES[0].url + ".missing")
    with pytest.raises(ToolchainError) as raised:
        download(package, tmp_path / "debs", NetworkPolicy())
    assert f"cannot download libgtest-dev 1.12.1-0.2 from {package.url}" in raised.value.message
    assert "snapshot.debian.org" in (raised.value.fix or "")


def test_two_processes_set_up_one_root_and_crash_leftovers_are_not_trusted(
    tmp_path: Path,
) -> None:
    toolchain_dir = tmp_path / "toolchain"
    name = root_name(GTEST_PACKAGES)
    # What a crashed run leaves: a staging directory and a root without its marker.
    (toolchain_dir / f".{name}.tmp-crashed").mkdir(parents=True)
    (toolchain_dir / name / "usr").mkdir(parents=True)
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from xla_host.net import NetworkPolicy
        from xla_wheels.series_checks.toolchain import BOOKWORM_PACKAGES, ensure_debian_root
        packages = tuple(p for p in BOOKWORM_PACKAGES if p.name in ("libgtest-dev", "libgmock-dev"))
        print(ensure_debian_root(Path(sys.argv[1]), packages, NetworkPolicy()))
        """
    )
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(toolchain_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [(*run.communicate(timeout=300), run.returncode) for run in runs]
    assert [code for _, _, code in results] == [0, 0], results
    assert {out.strip() for out, _, _ in results} == {str(toolchain_dir / name)}
    root = toolchain_dir / name
    assert (root / "usr/include/gtest/gtest.h").is_file()
    assert (root / "usr/include/gmock/gmock.h").is_file()
    assert (root / "usr/lib/x86_64-linux-gnu/libgtest_main.a").is_file()
    marker = json.loads((root / MARKER).read_text())
    assert [p["sha256"] for p in marker["packages"]] == [p.sha256 for p in GTEST_PACKAGES]
    assert sorted(p.name for p in toolchain_dir.iterdir()) == sorted([name, f"{name}.lock", "debs"])
    # Set up: a third call neither downloads nor unpacks (the .debs could be gone).
    for deb in (toolchain_dir / "debs").iterdir():
        deb.unlink()
    assert ensure_debian_root(toolchain_dir, GTEST_PACKAGES, NetworkPolicy()) == root


# --- How programs are built and judged (a small tree of our own) ----------------------------

CLIENT_HEADER = """\
#include <string>
class Client {
 public:
  int Sum();
  // A comment mentioning missing_;

 private:
  int present_ = 1;
  std::string
      name_;
  int Inline() { int missing_; return missing_; }
};
"""
CLIENT_SOURCE = """\
#include <cstdio>
#include <string>

int Client::Sum() {
  return present_ + missing_;
}
"""
PROBE = """\
#include <iostream>
#include "std_includes.inc"
class Client {
 public:
  int Sum();
#include "members.inc"
};
#include "sum.inc"
int main() {
  std::cout << "PASS compiled" << std::endl;
  std::cout << "FAIL exits_zero: on purpose" << std::endl;
  return 0;
}
"""


# The programs link what their Bazel target declares: the extension links both torch
# libraries through a library, the test only libtorch_cpu.
SMALL_BUILD = """\
cc_binary(
    name = "_XLAC.so",
    deps = [":runtime"],
)

cc_library(
    name = "runtime",
    deps = ["@torch//:libtorch_cpu", "@torch//:libc10"],
)

cc_test(
    name = "warn_test",
    deps = ["@torch//:libtorch_cpu"],  # For TORCH_LAZY_COUNTER
)
"""
WARN_PROBE = """\
#include <iostream>
#include <c10/util/Exception.h>
int main() {
  TORCH_WARN("from the probe");
  std::cout << "PASS warned" << std::endl;
  return 0;
}
"""


@pytest.fixture
def small_project(tmp_path: Path) -> tuple[Path, Path]:
    """(project root with check programs, tree with a class, a function and a BUILD)."""
    project, tree = tmp_path / "project", tmp_path / "tree"
    checks = project / "patches" / "torch_xla" / "checks"
    checks.mkdir(parents=True)
    (checks / "probe.cpp").write_text(PROBE)
    (checks / "warn.cpp").write_text(WARN_PROBE)
    (tree / "a").mkdir(parents=True)
    (tree / "BUILD").write_text(SMALL_BUILD)
    (tree / "a" / "client.h").write_text(CLIENT_HEADER)
    (tree / "a" / "client.cpp").write_text(CLIENT_SOURCE)
    return project, tree


def _probe(members: tuple[str, ...]) -> CheckProgram:
    return CheckProgram(
        name="probe",
        kind="checks",
        sources=("probe.cpp",),
        generated=(
            Members("members.inc", "a/client.h", "Client", members),
            Function("sum.inc", "a/client.cpp", "int Client::Sum("),
            StdIncludes("std_includes.inc", "a/client.cpp"),
        ),
    )


def test_generated_files_are_verbatim_with_line_directives(
    small_project: tuple[Path, Path],
) -> None:
    _, tree = small_project
    members = Members("m.inc", "a/client.h", "Client", ("present_", "name_", "missing_"))
    assert generate(tree, members) == (
        '#line 8 "a/client.h"\n'
        "  int present_ = 1;\n"
        '#line 9 "a/client.h"\n'
        "  std::string\n"
        "      name_;\n"
        "// Client::missing_: not declared in a/client.h\n"
    )
    function = generate(tree, Function("f.inc", "a/client.cpp", "int Client::Sum("))
    assert function.startswith('#line 4 "a/client.cpp"\nint Client::Sum() {\n')
    assert generate(tree, StdIncludes("s.inc", "a/client.cpp")) == (
        "#include <cstdio>\n#include <string>\n"
    )


def test_a_member_the_header_lacks_fails_the_build_naming_it_at_the_tree_line(
    series_toolchain: Toolchain, small_project: tuple[Path, Path], tmp_path: Path
) -> None:
    project, tree = small_project
    [outcome] = run_series_checks(
        tree, series_toolchain, tmp_path / "work", (_probe(("present_",)),), project_root=project
    )
    assert outcome.verdicts == {}
    assert outcome.compile_errors
    missing = [error for error in outcome.compile_errors if error.identifier == "missing_"]
    assert missing and (missing[0].path, missing[0].line) == ("a/client.cpp", 5), outcome.output


def test_a_program_breaking_its_exit_status_contract_cannot_pass(
    series_toolchain: Toolchain, small_project: tuple[Path, Path], tmp_path: Path
) -> None:
    project, tree = small_project
    declared = CLIENT_HEADER.replace("int Inline()", "int missing_ = 2;\n  int Inline()")
    (tree / "a" / "client.h").write_text(declared)
    [outcome] = run_series_checks(
        tree,
        series_toolchain,
        tmp_path / "work",
        (_probe(("present_", "missing_")),),
        project_root=project,
    )
    assert not outcome.compile_errors, outcome.output
    assert outcome.verdicts == {
        "compiled": "PASS",
        "exits_zero": "on purpose",
        PROGRAM_VERDICT: "exit status 0 with 1 failed check(s)",
    }


def test_a_torch_library_the_bazel_target_does_not_declare_fails_the_link(
    series_toolchain: Toolchain, small_project: tuple[Path, Path], tmp_path: Path
) -> None:
    # TORCH_WARN is in libc10; GNU ld refuses a target declaring only libtorch_cpu (which
    # needs libc10: "DSO missing from command line" or an undefined reference), as
    # Bazel's link would be.
    project, tree = small_project
    warn = CheckProgram(name="warn", kind="checks", sources=("warn.cpp",))
    outcomes = {
        target: run_series_checks(
            tree,
            series_toolchain,
            tmp_path / target.strip("/:"),
            (replace(warn, link_target=target),),
            project_root=project,
        )[0]
        for target in ("//:warn_test", "//:_XLAC.so")
    }
    assert outcomes["//:_XLAC.so"].verdicts == {"warned": "PASS"}, outcomes["//:_XLAC.so"].output
    refused = outcomes["//:warn_test"]
    assert refused.verdicts == {}
    # ld names the c10 symbols (or, when another object pulls them in, libc10.so).
    named = [error.identifier or "" for error in refused.compile_errors]
    assert any(name.startswith(("c10::", "libc10")) for name in named), refused.output


ANSWER_HEADER = "int Answer();\n"
ANSWER_SOURCE = '#include "a/answer.h"\nint Answer() { return 42; }\n'
ANSWER_CHECK = """\
#include <iostream>
#include "a/answer.h"
namespace generated {
#include "answer.inc"
}
int main() {
  if (Answer() == 42 && generated::Answer() == 42) {
    std::cout << "PASS answer" << std::endl;
    return 0;
  }
  std::cout << "FAIL answer: " << Answer() << std::endl;
  return 1;
}
"""
# -g: debug info and g++'s preprocessed output hold the work directory, which differs
# between the runs below. The generated file's #line names a path ccache cannot find from
# the work directory: it then keys the preprocessed source (not the files it read).
ANSWER = CheckProgram(
    name="answer_check",
    kind="checks",
    sources=("answer_check.cpp",),
    tree_sources=("a/answer.cpp",),
    generated=(Function("answer.inc", "a/answer.cpp", "int Answer("),),
    compile_flags=("-g",),
)


def _ccache_stats(cache: CompilerCache) -> dict[str, int]:
    printed = subprocess.run(
        [str(cache.executable), "--dir", str(cache.directory), "--print-stats"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    counters = dict(line.split("\t") for line in printed.splitlines())
    return {
        "hits": int(counters["direct_cache_hit"]) + int(counters["preprocessed_cache_hit"]),
        "misses": int(counters["cache_miss"]),
        "failed": int(counters["compile_failed"]),
    }


def test_another_copy_of_the_tree_is_built_from_the_compile_cache_but_never_a_failure(
    series_toolchain: Toolchain, small_project: tuple[Path, Path], tmp_path: Path
) -> None:
    ccache = shutil.which("ccache")
    if ccache is None:
        skip_missing("ccache (make cache-tools installs it)")
    project, tree = small_project
    (project / "patches/torch_xla/checks/answer_check.cpp").write_text(ANSWER_CHECK)
    (tree / "a" / "answer.h").write_text(ANSWER_HEADER)
    (tree / "a" / "answer.cpp").write_text(ANSWER_SOURCE)
    cache = CompilerCache(Path(ccache), tmp_path / "ccache")
    cached = replace(series_toolchain, compiler_cache=cache)

    def build(toolchain: Toolchain, tree: Path, work: str) -> CheckOutcome:
        [outcome] = run_series_checks(
            tree, toolchain, tmp_path / work, (ANSWER,), project_root=project
        )
        return outcome

    plain = build(replace(series_toolchain, compiler_cache=None), tree, "work-plain")
    assert plain.verdicts == {"answer": "PASS"}, plain.output
    assert not (tmp_path / "ccache").exists(), "no ccache: g++ alone"

    first = build(cached, tree, "work-first")
    assert _ccache_stats(cache) == {"hits": 0, "misses": 2, "failed": 0}
    # Another copy of the tree, deeper, built in another work directory: served whole.
    copy = shutil.copytree(tree, tmp_path / "elsewhere" / "deeper" / "tree")
    second = build(cached, copy, "work-second")
    assert _ccache_stats(cache) == {"hits": 2, "misses": 2, "failed": 0}
    assert first.verdicts == second.verdicts == {"answer": "PASS"}, second.output
    fresh, served = (
        tmp_path / work / ANSWER.name / "objects" for work in ("work-plain", "work-second")
    )
    assert sorted(p.name for p in served.iterdir()) == ["0-answer_check.o", "1-answer.o"]
    for obj in served.iterdir():  # what the cache gives is what g++ gives
        assert obj.read_bytes() == (fresh / obj.name).read_bytes(), obj.name

    # A source that does not compile is compiled by g++ every time, never served (both
    # do not here: answer_check.cpp includes the function too, at its tree line).
    (copy / "a" / "answer.cpp").write_text(ANSWER_SOURCE.replace("42", "missing_"))
    failures = [build(cached, copy, f"work-broken-{n}") for n in (1, 2)]
    assert _ccache_stats(cache) == {"hits": 2, "misses": 2, "failed": 4}
    for failed in failures:
        assert failed.verdicts == {}
        assert [(e.path, e.line, e.identifier) for e in failed.compile_errors] == [
            ("a/answer.cpp", 2, "missing_")
        ], failed.output


def test_the_compile_cache_is_ccache_on_path_unless_ccache_disable_says_not(
    tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cache_dir = tmp_path / "machine-cache"
    assert compiler_cache(cache_dir, {"PATH": str(bin_dir)}) is None, "no ccache: plain g++"
    ccache = shutil.which("ccache")
    if ccache is None:
        skip_missing("ccache (make cache-tools installs it)")
    (bin_dir / "ccache").symlink_to(ccache)
    found = compiler_cache(cache_dir, {"PATH": str(bin_dir), "CCACHE_DISABLE": "0"})
    assert found == CompilerCache(bin_dir / "ccache", cache_dir / "ccache-series-checks")
    assert found.directory.is_dir()
    for value in ("1", "true"):
        assert compiler_cache(cache_dir, {"PATH": str(bin_dir), "CCACHE_DISABLE": value}) is None


def test_build_files_give_each_target_its_declared_torch_libraries(tmp_path: Path) -> None:
    (tmp_path / "bazel").mkdir()
    (tmp_path / "bazel" / "rules_def.bzl").write_text(
        "def ptxla_cc_test(deps, **kwargs):\n"
        "    native.cc_test(\n"
        '        deps = deps + [\n            "@torch//:libc10",  # added\n        ],\n'
        "        **kwargs\n    )\n"
        "def other(**kwargs):\n    pass\n"
    )
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "BUILD").write_text(
        'load("//bazel:rules_def.bzl", "ptxla_cc_test")\n'
        "cc_library(\n"
        '    name = "cache",\n'
        '    hdrs = ["cache.h"],  # "@torch//:libtorch" in a comment is no dependency\n'
        '    deps = ["@torch//:headers"] + select({\n'
        '        "//c:x": ["//other:lib"],\n'
        '        "//conditions:default": [],\n'
        "    }),\n"
        ")\n"
        "cc_test(\n"
        '    name = "cache_test",\n'
        "    deps = [\n"
        '        ":cache",\n'
        '        ":helper",  # labels starting with ":" are no select() conditions\n'
        '        "@com_google_googletest//:gtest_main",\n'
        '        "@torch//:libtorch_cpu",\n'
        "    ],\n"
        ")\n"
        'cc_library(name = "helper", deps = ["@torch//:libtorch"])\n'
        'ptxla_cc_test(\n    name = "macro_test",\n    deps = ["cache"],\n)\n'
    )
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "BUILD").write_text(
        'cc_library(name = "lib", deps = ["@torch//:libtorch_python"])\n'
    )
    assert external_deps(tmp_path, "//pkg:cache_test") == {
        "@torch//:headers",
        "@torch//:libtorch_python",
        "@com_google_googletest//:gtest_main",
        "@torch//:libtorch_cpu",
        "@torch//:libtorch",
    }
    assert torch_libraries(tmp_path, "//pkg:cache_test") == ("torch_python", "torch", "torch_cpu")
    assert torch_libraries(tmp_path, "//pkg:macro_test") == ("torch_python", "c10")
    with pytest.raises(BuildFileError, match="//pkg:missing is not defined"):
        torch_libraries(tmp_path, "//pkg:missing")
    with pytest.raises(BuildFileError, match="no BUILD file for //nowhere"):
        torch_libraries(tmp_path, "//nowhere:x")


def test_cache_test_links_libc10_once_cache_h_warns(base_tree: Path, patched_tree: Path) -> None:
    # cache.h at c04e61c uses no c10 symbol; the series' TORCH_WARN needs libc10, so the
    # series must declare it (runtime/BUILD), or Bazel's link of cache_test fails.
    target = UPSTREAM_CACHE_TEST.link_target
    assert torch_libraries(base_tree, target) == ("torch_cpu",)
    assert torch_libraries(patched_tree, target) == ("torch_cpu", "c10")
    assert "TORCH_WARN" in (patched_tree / "torch_xla/csrc/runtime/cache.h").read_text()


def test_gxx_errors_are_parsed_into_file_line_and_missing_name(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    stderr = "\n".join(
        [
            f"{tree}/torch_xla/csrc/runtime/env_hash.cpp:12:3: error: 'HashFoo' was not declared"
            " in this scope; did you mean 'HashBar'?",
            "torch_xla/csrc/runtime/pjrt_computation_client.cpp:812:14: error: 'class "
            "torch_xla::runtime::PjRtComputationClient' has no member named "
            "'custom_compile_options_'",
            f"{tree}/a.cpp:3:10: fatal error: xla/pjrt/pjrt_client.h: No such file or directory",
            f"{tree}/b.cpp:4:5: error: 'Thing' is not a member of 'torch_xla::runtime'",
            f"{tree}/b.cpp:9:5: error: expected ';' before '}}' token",
            "/usr/bin/ld: x.o: in function `main': undefined reference to `absl::Foo()'",
            "/usr/bin/ld: y.o: undefined reference to symbol '_ZN3c104warnERKNS_7WarningE'",
            "/usr/bin/ld: /site/torch/lib/libc10.so: error adding symbols: DSO missing from "
            "command line",
        ]
    )
    assert parse_compile_errors(stderr, tree, tmp_path) == (
        CompileError(
            "torch_xla/csrc/runtime/env_hash.cpp",
            12,
            "HashFoo",
            "'HashFoo' was not declared in this scope; did you mean 'HashBar'?",
        ),
        CompileError(
            "torch_xla/csrc/runtime/pjrt_computation_client.cpp",
            812,
            "custom_compile_options_",
            "'class torch_xla::runtime::PjRtComputationClient' has no member named "
            "'custom_compile_options_'",
        ),
        CompileError(
            "a.cpp",
            3,
            "xla/pjrt/pjrt_client.h",
            "xla/pjrt/pjrt_client.h: No such file or directory",
        ),
        CompileError("b.cpp", 4, "Thing", "'Thing' is not a member of 'torch_xla::runtime'"),
        CompileError("b.cpp", 9, None, "expected ';' before '}' token"),
        CompileError("", 0, "absl::Foo()", "undefined reference to 'absl::Foo()'"),
        CompileError(
            "",
            0,
            "_ZN3c104warnERKNS_7WarningE",
            "undefined reference to '_ZN3c104warnERKNS_7WarningE'",
        ),
        CompileError(
            "",
            0,
            "libc10.so",
            "DSO missing from command line: libc10.so is needed but the program's Bazel "
            "target does not declare it",
        ),
    )
    assert parse_compile_errors("collect2: error: ld returned 1 exit status\n", tree) == (
        CompileError("", 0, None, "collect2: error: ld returned 1 exit status"),
    )


# --- The real source: a member v2.9.0 does not have ------------------------------------------

MEMBERS_PROBE = """\
#include <string>
#include <unordered_map>
#include <iostream>
#include <torch/csrc/lazy/core/hash.h>
class PjRtComputationClient {
 public:
#include "client_members.inc"
};
int main() {
  PjRtComputationClient client;
  client.custom_compile_options_["xla_foo"] = "1";
  std::cout << "PASS members_declared" << std::endl;
  return 0;
}
"""


def test_a_member_declared_at_c04e61c_but_not_at_v2_9_0_is_named(
    series_toolchain: Toolchain, pytorch_xla_repo: Path, tmp_path: Path
) -> None:
    tags = git(pytorch_xla_repo, "tag", "--list", real_source.V2_9_0_TAG)
    if not tags.strip():
        pytest.skip(f"the pytorch/xla source has no tag {real_source.V2_9_0_TAG}")
    project = tmp_path / "project"
    checks = project / "patches" / "torch_xla" / "checks"
    checks.mkdir(parents=True)
    (checks / "members_probe.cpp").write_text(MEMBERS_PROBE)
    probe = CheckProgram(
        name="members_probe",
        kind="checks",
        sources=("members_probe.cpp",),
        generated=(
            Members(
                "client_members.inc",
                CLIENT_H,
                "PjRtComputationClient",
                ("comp_env_hash_", "custom_compile_options_"),
            ),
        ),
    )
    outcomes = {}
    for label, commit in (("base", real_source.BASE), ("v2.9.0", real_source.V2_9_0_TAG)):
        tree = real_source.worktree(pytorch_xla_repo, tmp_path / label, commit)
        [outcomes[label]] = run_series_checks(
            tree, series_toolchain, tmp_path / f"work-{label}", (probe,), project_root=project
        )
    assert outcomes["base"].verdicts == {"members_declared": "PASS"}, outcomes["base"].output
    named = {error.identifier for error in outcomes["v2.9.0"].compile_errors}
    assert "custom_compile_options_" in named, outcomes["v2.9.0"].output


# --- The CI rule: a real-source test may not skip -------------------------------------------


@pytest.mark.parametrize("ci", ["true", ""])
def test_in_ci_a_skipped_real_source_test_fails(ci: str, tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems, pytest_runtest_makereport\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'real_source: needs the real source')\n"
    )
    (tmp_path / "test_probe.py").write_text(
        "import pytest\n"
        "@pytest.mark.real_source\n"
        "def test_marked():\n"
        "    pytest.skip('no pytorch/xla source here')\n"
        "def test_unmarked():\n"
        "    pytest.skip('not about the source')\n"
    )
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        text=True,
        capture_output=True,
        check=False,
    )
    if ci and real_source.SHARED_SNAPSHOT.is_dir():
        assert "1 failed, 1 skipped" in run.stdout, run.stdout
        assert "a real_source test skipped in CI" in run.stdout
        assert "no pytorch/xla source here" in run.stdout
    else:
        assert "2 skipped" in run.stdout, run.stdout


# --- The table of canonical HLO cases, generated for the C++ check --------------------------

CASES_PRINTER = """\
#include <cstdio>
#include <cstring>
#include <initializer_list>
struct Case {
  const char* name;
  bool equal;
  const char* a;
  const char* b;
  const char* python_a;
  const char* python_b;
};
const Case kCases[] = {
#include "canonical_hlo_cases.inc"
};
int main() {
  for (const Case& c : kCases) {
    for (const char* text : {c.name, c.a, c.b, c.python_a, c.python_b}) {
      std::fwrite(text, 1, std::strlen(text), stdout);
      std::fputc(0, stdout);
    }
    std::fputc(c.equal ? '=' : '!', stdout);
    std::fputc(0, stdout);
  }
  return 0;
}
"""


def test_the_cases_table_reaches_cpp_byte_for_byte(
    series_toolchain: Toolchain, tmp_path: Path
) -> None:
    """Every module of the table, and the Python rules' canonical text of it, arrive in the
    C++ check as the same bytes: quotes, backslashes, carriage returns, '?' and non-ASCII
    included (the cases use all but the last; one is added here)."""
    table = tmp_path / "cases.toml"
    original = (REPO_ROOT / CANONICAL_CASES_TABLE).read_text(encoding="utf-8")
    extra = (
        '\n[[case]]\nname = "odd bytes ??= é"\nexpect = "different"\nwhy = "w"\n'
        'a = "x\\"y\\r\\n"\nb = "??/"\n'
    )
    table.write_text(original + extra, encoding="utf-8")
    inc = canonical_cases_text(table, "cases.toml")
    (tmp_path / "canonical_hlo_cases.inc").write_text(inc, encoding="utf-8")
    (tmp_path / "printer.cpp").write_text(CASES_PRINTER)
    binary = tmp_path / "printer"
    subprocess.run(
        [
            str(series_toolchain.compiler),
            "-std=c++17",
            "-I",
            str(tmp_path),
            "-o",
            str(binary),
            str(tmp_path / "printer.cpp"),
        ],
        check=True,
    )
    out = subprocess.run([str(binary)], capture_output=True, check=True).stdout
    expected = b""
    for case in tomllib.loads(original + extra)["case"]:
        for text in (
            case["name"],
            case["a"],
            case["b"],
            canonical_text(case["a"]),
            canonical_text(case["b"]),
        ):
            expected += text.encode("utf-8") + b"\0"
        expected += (b"=" if case["expect"] == "equal" else b"!") + b"\0"
    assert out == expected
