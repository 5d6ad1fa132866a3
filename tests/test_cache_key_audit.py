"""The cache key audit: every environment read and Python setter of torch_xla/csrc is keyed
or listed as outside the key, in one table that the documented key table (docs/cache-key.md)
is rendered from.

The scanner is pinned down on a small tree of our own (each way a read is written); the
audit itself runs on the real pytorch/xla source with the series applied (``real_source``
tests: the patched tree passes, c04e61c without the series fails, a table without one
keyed input fails naming each read of it, a new reader in a throwaway copy of a file is
named with its line), and through ``patches-check`` as a user runs it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import real_source
from tests.bundles import LIBTPU_RUNTIME, Pin, write_bundle
from tests.gitrepos import REPO_ROOT, make_repo
from xla_wheels.series_checks.key_audit import (
    TABLE_PAGE,
    TABLE_SUBPATH,
    KeyTable,
    KeyTableError,
    audit,
    load_table,
    parse_table,
    readme_block,
    readme_table,
    scan_reads,
    scan_setters,
)

# --- The table and its page in docs/-----------------------------------------------------------


def test_the_documented_key_table_is_the_audits_list() -> None:
    table = load_table(REPO_ROOT)
    block = readme_block((REPO_ROOT / TABLE_PAGE).read_text(encoding="utf-8"))
    assert block is not None, f"{TABLE_PAGE} lost its cache-key-table markers"
    assert block == readme_table(table), (
        f"{TABLE_PAGE}'s key table differs from {TABLE_SUBPATH}: render it again ({TABLE_PAGE}, "
        "'What the persistent cache key covers')"
    )
    # Every name the audit matches is in the documented table, in the row of its entry.
    rows = block.split("\n")[2:]
    for entry, row in zip(table.entries, rows, strict=False):
        for name in (*entry.env, *entry.setters):
            assert f"`{name}`" in row, (name, row)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('[[input]]\ntitle = "x"\nstatus = "maybe"\nwhere = "y"\n', "has status 'maybe'"),
        ('[[input]]\ntitle = "x"\nstatus = "outside"\n', "needs a non-empty string `why`"),
        (
            '[[input]]\ntitle = "a"\nstatus = "outside"\nwhy = "w"\nenv = ["A"]\n'
            '[[input]]\ntitle = "b"\nstatus = "outside"\nwhy = "w"\nenv = ["A"]\n',
            "A is listed twice",
        ),
        (
            '[[input]]\ntitle = "x"\nstatus = "outside"\nwhy = "y"\nhashed_in = "f.cpp"\n',
            "names hashed_in but has status 'outside'",
        ),
        ("[[input]\n", "is not valid TOML"),
    ],
)
def test_a_malformed_table_is_refused_naming_the_row(text: str, complaint: str) -> None:
    with pytest.raises(KeyTableError) as raised:
        parse_table(text, "t.toml")
    assert complaint in raised.value.message
    assert raised.value.exit_code == 2 and raised.value.fix


# --- The scanner, on a tree of our own ------------------------------------------------------

ENV_VARS_H = """\
namespace env {
inline constexpr char kEnvPjRtDevice[] = "PJRT_DEVICE";
}
"""
LOWERING_CPP = """\
#include "sys_util.h"
int Factor() {
  static int factor =
      runtime::sys_util::GetEnvInt(
          "XLA_SPLIT_OVER_LINES", 8192);
  // static bool old = sys_util::GetEnvBool("XLA_IN_A_COMMENT", false);
  std::string device = sys_util::GetEnvString(env::kEnvPjRtDevice, "");
  const char* level = getenv("TF_CPP_MIN_LOG_LEVEL");
  std::string flags = sys_util::GetEnvString(name.c_str(), "");
  return factor;
}
"""
SYS_UTIL_H = "std::string GetEnvString(const char* name, const std::string& defval);\n"
BINDINGS_CPP = """\
void Init(py::module m) {
  m.def("_xla_set_mat_mul_precision",
        [](const std::string& p) { XlaHelpers::set_mat_mul_precision(p); })
      .def("_get_ir_debug", []() { return FLAGS_torch_lazy_ir_debug; })
      .def("_enable_thing", [](bool on) { FLAGS_torch_lazy_thing = on; })
      .def(
          "_use_mode",
          [](bool on) { XLAGraphExecutor::Get()->SetUseMode(on); })
      .def("_get_count", []() { return Counter::Get()->count == 1; })
      .def("_xla_set_seed", [](int seed) { SetRngSeed(seed); });
}
"""
SMALL_TABLE = """\
[[input]]
title = "lowering"
status = "keyed"
env = ["XLA_SPLIT_OVER_LINES"]
setters = ["_xla_set_mat_mul_precision", "_enable_thing", "_use_mode", "_xla_set_seed"]
where = "HashLowering"
hashed_in = "torch_xla/csrc/key.cpp"

[[input]]
title = "runtime"
status = "outside"
env = ["PJRT_DEVICE", "TF_CPP_MIN_LOG_LEVEL"]
why = "not compiled"

[[indirect]]
file = "torch_xla/csrc/lowering.cpp"
argument = "name.c_str()"
why = "the flags"
"""


@pytest.fixture
def small_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    csrc = tree / "torch_xla" / "csrc"
    (csrc / "runtime").mkdir(parents=True)
    (csrc / "runtime" / "env_vars.h").write_text(ENV_VARS_H)
    (csrc / "runtime" / "sys_util.h").write_text(SYS_UTIL_H)
    (csrc / "lowering.cpp").write_text(LOWERING_CPP)
    (csrc / "lowering_test.cpp").write_text('int x = GetEnvInt("ONLY_IN_A_TEST", 1);\n')
    (csrc / "init_python_bindings.cpp").write_text(BINDINGS_CPP)
    (csrc / "key.cpp").write_text('hash = Hash(GetEnvInt("XLA_SPLIT_OVER_LINES", 1));\n')
    return tree


def test_the_scanner_finds_each_way_a_read_is_written(small_tree: Path) -> None:
    found = scan_reads(small_tree)
    reads = {(r.path.rsplit("/", 1)[-1], r.line, r.name, r.argument) for r in found}
    assert reads == {
        ("key.cpp", 1, "XLA_SPLIT_OVER_LINES", '"XLA_SPLIT_OVER_LINES"'),
        ("lowering.cpp", 5, "XLA_SPLIT_OVER_LINES", '"XLA_SPLIT_OVER_LINES"'),
        ("lowering.cpp", 7, "PJRT_DEVICE", "env::kEnvPjRtDevice"),
        ("lowering.cpp", 8, "TF_CPP_MIN_LOG_LEVEL", '"TF_CPP_MIN_LOG_LEVEL"'),
        ("lowering.cpp", 9, None, "name.c_str()"),
    }, "a comment, a test file and a declaration are no reads"
    setters = {(s.binding, s.line) for s in scan_setters(small_tree)}
    # By a static setter, by a FLAGS_ assignment, by a singleton's Set..., by its name
    # alone; a getter reading a FLAGS_ global or comparing with == is none.
    assert setters == {
        ("_xla_set_mat_mul_precision", 2),
        ("_enable_thing", 5),
        ("_use_mode", 6),
        ("_xla_set_seed", 10),
    }


def test_the_small_tree_passes_and_each_unlisted_input_is_named(small_tree: Path) -> None:
    table = parse_table(SMALL_TABLE)
    assert audit(small_tree, table).passed
    for name, where in [
        ("XLA_SPLIT_OVER_LINES", "torch_xla/csrc/lowering.cpp:5"),
        ("PJRT_DEVICE", "torch_xla/csrc/lowering.cpp:7"),
        ("_use_mode", "torch_xla/csrc/init_python_bindings.cpp:6"),
    ]:
        report = audit(small_tree, table.without(name))
        rendered = [finding.render() for finding in report.findings]
        assert any(line.startswith(where + ":") and name in line for line in rendered), rendered
    unindirect = KeyTable(table.entries, ())
    [finding] = audit(small_tree, unindirect).findings
    assert finding.render().startswith("torch_xla/csrc/lowering.cpp:9: GetEnvString(name.c_str()")


def test_a_keyed_row_whose_file_does_not_hash_it_is_a_finding(small_tree: Path) -> None:
    (small_tree / "torch_xla/csrc/key.cpp").write_text("hash = 0;\n")
    [finding] = audit(small_tree, parse_table(SMALL_TABLE)).findings
    assert finding.render() == (
        f'torch_xla/csrc/key.cpp: {TABLE_SUBPATH} says "XLA_SPLIT_OVER_LINES" is hashed '
        "here, but this file does not name it"
    )


# --- The real source ------------------------------------------------------------------------


def test_the_real_series_passes_the_audit(patched_tree: Path) -> None:
    report = audit(patched_tree, load_table(REPO_ROOT))
    assert report.passed, "\n".join(report.lines())
    assert report.reads > 100 and report.setters > 15
    # What the lowering reads (the BF16 switches the issue reproduced among it) is read,
    # and in the key through the module.
    names = {read.name for read in scan_reads(patched_tree)}
    for name in ("XLA_DOWNCAST_BF16", "XLA_USE_BF16", "XLA_DENSE_GATHER_FACTOR", "XLA_LAYOUTS"):
        assert name in names and load_table(REPO_ROOT).env_names()[name].status == "module"


def test_c04e61c_without_the_series_fails_the_audit(base_tree: Path) -> None:
    report = audit(base_tree, load_table(REPO_ROOT))
    rendered = "\n".join(finding.render() for finding in report.findings)
    # The base keys neither the module nor the options it is compiled with.
    assert "says runtime::cache_key::CanonicalHloText( is hashed here" in rendered
    assert "says BuildCompileOptions(instance).ToProto() is hashed here" in rendered


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("XLA_DENSE_GATHER_FACTOR", "torch_xla/csrc/data_ops.cpp"),
        ("_xla_set_mat_mul_precision", "torch_xla/csrc/init_python_bindings.cpp"),
    ],
)
def test_a_table_without_one_keyed_input_fails_naming_its_reads(
    patched_tree: Path, name: str, where: str
) -> None:
    report = audit(patched_tree, load_table(REPO_ROOT).without(name))
    assert not report.passed
    rendered = [finding.render() for finding in report.findings]
    assert all(name in line for line in rendered), rendered
    line = next(line for line in rendered if line.startswith(where + ":"))
    number = int(line.split(":")[1])
    source = (patched_tree / where).read_text(encoding="utf-8").split("\n")
    assert name in "\n".join(source[number - 1 : number + 1]), (line, source[number - 1])


def test_a_new_reader_in_a_copy_of_a_source_file_is_named(
    patched_tree: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "tree"
    shutil.copytree(patched_tree / "torch_xla" / "csrc", copy / "torch_xla" / "csrc")
    data_ops = copy / "torch_xla/csrc/data_ops.cpp"
    lines = data_ops.read_text(encoding="utf-8").split("\n")
    at = next(i for i, line in enumerate(lines) if '"XLA_DENSE_GATHER_FACTOR", 8192' in line) + 1
    lines.insert(
        at, '    static int knob = runtime::sys_util::GetEnvInt("XLA_NEW_LOWERING_KNOB", 1);'
    )
    data_ops.write_text("\n".join(lines), encoding="utf-8")
    [finding] = audit(copy, load_table(REPO_ROOT)).findings
    assert finding.render() == (
        f'torch_xla/csrc/data_ops.cpp:{at + 1}: GetEnvInt("XLA_NEW_LOWERING_KNOB") reads '
        "XLA_NEW_LOWERING_KNOB, which the table neither keys nor lists as outside the key"
    )


@pytest.mark.slow
def test_patches_check_runs_the_audit_and_fails_naming_the_read(
    tmp_path: Path, run_cli, pytorch_xla_repo: Path
) -> None:
    project = tmp_path / "project"
    shutil.copytree(REPO_ROOT / "patches" / "torch_xla", project / "patches" / "torch_xla")
    series = sorted(path.name for path in (project / "patches/torch_xla").glob("*.patch"))
    stand_in = make_repo(tmp_path / "stand-in", {"README": "stand-in\n"})  # never fetched
    write_bundle(
        project,
        "audit",
        {
            "torch": Pin("https://github.com/pytorch/pytorch.git", stand_in, "2.9.0"),
            "torch_xla": Pin(
                "https://github.com/pytorch/xla.git",
                real_source.BASE,
                "2.9.0",
                [f"torch_xla/{n}" for n in series],
            ),
            "openxla": Pin("https://github.com/openxla/xla.git", stand_in),
        },
        runtime=LIBTPU_RUNTIME,
    )

    def check() -> tuple[int, str, str]:
        result = run_cli(
            "patches-check", "--bundle", "audit", "--source", str(pytorch_xla_repo), root=project
        )
        return result.exit_code, result.stdout, result.stderr

    code, out, err = check()
    assert code == 0, out + err
    assert "cache key audit: every one of" in out
    table = project / TABLE_SUBPATH
    text = table.read_text(encoding="utf-8")
    table.write_text(text.replace('    "XLA_LAYOUTS",\n', ""), encoding="utf-8")
    code, out, err = check()
    assert code == 1, out + err
    # layout_manager.cpp reads XLA_LAYOUTS itself (0003 no longer routes it through env_hash).
    assert "torch_xla/csrc/layout_manager.cpp:" in out and '"XLA_LAYOUTS"' in out, out
    assert "the cache key audit found" in err and "cache_key_inputs.toml" in err
    assert "Traceback" not in out + err
