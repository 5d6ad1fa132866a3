"""``key-probe``: the cache key probed on the real runtime, input by input.

The verdict is a pure function of the children's rows, specified here case by case; the
check itself runs on real stock wheels inside the shared gate runs (tests/conftest.py):
stock 2.7.0 (``gate_27``, with the fast probes) must FAIL naming ``XLA_DOWNCAST_BF16``,
the negative control on the real runtime, and stock 2.9.0 (``gate_29``, every probe) must
FAIL because its cache never loads, not pass on misses alone.
"""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.gate_helpers import GateRun
from xla_host.errors import UsageError
from xla_host.gate import keyprobe
from xla_host.gate.keyprobe import Probe

REPO = Path(__file__).resolve().parents[1]
CHILD = keyprobe.CHILD


def _child_module() -> Any:
    spec = importlib.util.spec_from_file_location("key_probe_child_under_test", CHILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _graph(name: str, module: str, *, hit: bool, output: str = "o") -> dict[str, Any]:
    return {
        "graph": name,
        "module": module,
        "hits": int(hit),
        "misses": int(not hit),
        "compiles": int(not hit),
        "output_sha256": output,
    }


COLD = {
    "ok": True,
    "compile_side_digest": "sha256:side",
    "graphs": [_graph("cast", "sha256:f32", hit=False), _graph("matmul", "sha256:mm", hit=False)],
}
CONTROL = Probe("control", "nothing changed", control=True)
BF16 = Probe("XLA_DOWNCAST_BF16", "bf16", env={"XLA_DOWNCAST_BF16": "1"})


def _warm(*graphs: dict[str, Any], side: str = "sha256:side") -> dict[str, Any]:
    return {"ok": True, "compile_side_digest": side, "graphs": list(graphs)}


LOADED_CONTROL = _warm(
    _graph("cast", "sha256:f32", hit=True), _graph("matmul", "sha256:mm", hit=True)
)


def _entry(result: keyprobe.CheckResult, probe: str) -> dict[str, Any]:
    return next(p for p in result.figures["probes"] if p["probe"] == probe)


# --- the verdict ------------------------------------------------------------------------------


def test_a_hit_of_another_module_fails_naming_the_input():
    warm = _warm(_graph("cast", "sha256:bf16", hit=True), _graph("matmul", "sha256:mm", hit=True))
    result = keyprobe.judge_key_probe(COLD, [(CONTROL, LOADED_CONTROL, None), (BF16, warm, None)])
    assert not result.passed
    assert any("XLA_DOWNCAST_BF16" in r and "cast" in r and "module" in r for r in result.reasons)
    assert _entry(result, "XLA_DOWNCAST_BF16")["status"] == keyprobe.FAIL


def test_a_hit_under_other_compile_settings_fails_although_the_module_is_the_same():
    flags = Probe("XLA_FLAGS flag file", "file", flag_file=("--xla_cpu_enable_fast_math=true",))
    warm = _warm(*LOADED_CONTROL["graphs"], side="sha256:fast-math")
    result = keyprobe.judge_key_probe(COLD, [(CONTROL, LOADED_CONTROL, None), (flags, warm, None)])
    assert not result.passed
    assert any("compiles under other settings" in r for r in result.reasons)


def test_a_miss_of_the_same_program_is_a_warning_not_a_failure():
    debug = Probe("XLA_HLO_DEBUG", "metadata", env={"XLA_HLO_DEBUG": "1"})
    warm = _warm(_graph("cast", "sha256:f32", hit=False), _graph("matmul", "sha256:mm", hit=True))
    result = keyprobe.judge_key_probe(COLD, [(CONTROL, LOADED_CONTROL, None), (debug, warm, None)])
    assert result.passed, result.reasons
    assert _entry(result, "XLA_HLO_DEBUG")["status"] == keyprobe.WARN
    assert any(n.startswith("WARN XLA_HLO_DEBUG") and "needless split" in n for n in result.notes)


def test_a_miss_of_another_program_and_a_hit_of_the_same_pass():
    warm = _warm(_graph("cast", "sha256:bf16", hit=False), _graph("matmul", "sha256:mm", hit=True))
    result = keyprobe.judge_key_probe(COLD, [(CONTROL, LOADED_CONTROL, None), (BF16, warm, None)])
    assert result.passed, result.reasons
    assert _entry(result, "XLA_DOWNCAST_BF16")["status"] == keyprobe.PASS


def test_a_cache_that_does_not_load_cannot_be_probed():
    unloaded = _warm(
        _graph("cast", "sha256:f32", hit=False), _graph("matmul", "sha256:mm", hit=False)
    )
    result = keyprobe.judge_key_probe(COLD, [(CONTROL, unloaded, None)])
    assert not result.passed
    assert any("cache does not load" in r for r in result.reasons)


def test_a_probe_that_does_not_apply_says_why_and_is_never_a_pass():
    result = keyprobe.judge_key_probe(
        COLD, [(CONTROL, LOADED_CONTROL, None), (BF16, None, "means something on TPU only")]
    )
    assert _entry(result, "XLA_DOWNCAST_BF16") | {} == {
        "probe": "XLA_DOWNCAST_BF16",
        "setting": "XLA_DOWNCAST_BF16=1",
        "why": "bf16",
        "status": keyprobe.NOT_APPLICABLE,
        "reason": "means something on TPU only",
    }


def test_a_probe_run_that_did_not_finish_fails_the_check():
    broken = {"ok": False, "error": "cold: killed by signal 9"}
    result = keyprobe.judge_key_probe(COLD, [(CONTROL, LOADED_CONTROL, None), (BF16, broken, None)])
    assert not result.passed
    assert any("did not finish" in r for r in result.reasons)


# --- the table and the selection ---------------------------------------------------------------


def test_the_shipped_table_loads_with_the_control_first_and_known_setters():
    probes = keyprobe.select(keyprobe.load_probes(), None)
    assert probes[0].control and sum(p.control for p in probes) == 1
    assert {p.setter for p in probes if p.setter} <= set(_child_module().SETTERS)
    assert "XLA_DOWNCAST_BF16" in {p.name for p in probes if p.fast}


def test_every_input_that_shapes_the_executable_is_probed_or_says_why_not():
    # The two files partition the inputs: what the series' key table says changes the
    # module or how it is compiled (patches/torch_xla/cache_key_inputs.toml) is either
    # changed by a probe or named in [not_probed] with a reason, never both, never neither.
    table = tomllib.loads((REPO / "patches" / "torch_xla" / "cache_key_inputs.toml").read_text())
    shaping = {
        name
        for row in table["input"]
        if row["status"] in ("module", "keyed")
        for name in row.get("env", [])
    }
    probes = keyprobe.load_probes()
    probed = {name for p in probes for name in p.env}
    probed |= {"XLA_FLAGS"} if any(p.xla_flags or p.flag_file for p in probes) else set()
    reasons = keyprobe.not_probed()
    assert sorted(shaping - probed - set(reasons)) == []
    assert sorted(probed & set(reasons)) == []
    assert sorted(set(reasons) - shaping) == []
    assert all(reasons.values())


def test_fast_selects_the_fast_subset_and_an_unknown_probe_is_refused():
    probes = keyprobe.load_probes()
    fast = keyprobe.select(probes, ["fast"])
    assert [p.name for p in fast] == [p.name for p in probes if p.fast or p.control]
    with pytest.raises(UsageError, match="unknown key probe.*XLA_DOWNCAST_BF1[^6]"):
        keyprobe.select(probes, ["XLA_DOWNCAST_BF1"])


def test_a_row_that_changes_two_inputs_is_refused(tmp_path: Path):
    table = tmp_path / "probes.toml"
    table.write_text(
        '[[probe]]\nname = "two"\nwhy = "x"\nenv = { A = "1" }\nxla_flags = ["--xla_b=1"]\n'
    )
    with pytest.raises(keyprobe.ProbeTableError, match="changes 2 inputs"):
        keyprobe.load_probes(table)


def test_the_docs_show_the_probe_table_as_rendered_from_the_file():
    page = (REPO / "docs" / "gate.md").read_text()
    assert keyprobe.with_docs_table(page, keyprobe.load_probes()) == page


def test_the_child_parses_flags_as_xla_does_a_file_read_quotes_kept_the_last_value_kept(
    tmp_path: Path,
):
    parsed_flags = _child_module().parsed_flags
    flag_file = tmp_path / "flags"
    flag_file.write_text(
        "--xla_cpu_enable_fast_math=false\n--xla_dump_to=/d\n--xla_a=1 --xla_a=2\n"
    )
    # A value without a leading "-" names the file (xla/parse_flags_from_env.cc).
    assert parsed_flags(str(flag_file)) == {"xla_cpu_enable_fast_math": "false", "xla_a": "2"}
    assert parsed_flags("--xla_a=2 --xla_a=1") == {"xla_a": "1"}
    assert parsed_flags(" --xla_b='x y' --xla_c") == {"xla_b": "x y", "xla_c": ""}
    # XLA stops at the first token that is not a flag.
    assert parsed_flags("--xla_a=1 stray --xla_b=2") == {"xla_a": "1"}


def test_a_flag_file_that_torch_xla_rewrote_is_named_not_run():
    lost = _child_module().flag_file_lost
    assert lost("--xla_a=1", "--xla_a=1 --xla_b=0") is None
    assert lost("/f", "/f") is None
    assert "cannot reach XLA" in lost("/f", "/f --xla_cpu_enable_fast_math=false")


# --- on the real runtime -----------------------------------------------------------------------


def test_stock_2_7_0_fails_the_key_probe_naming_the_bf16_switch(gate_27: GateRun):
    check = gate_27.check("key-probe")
    assert not check["passed"]
    assert any(r.startswith("XLA_DOWNCAST_BF16 ") and "cast" in r for r in check["reasons"])
    assert "[FAIL] key-probe" in gate_27.stdout
    probes = {p["probe"]: p for p in check["figures"]["probes"]}
    assert probes["control"]["status"] == keyprobe.PASS
    bf16 = {g["graph"]: g for g in probes["XLA_DOWNCAST_BF16"]["graphs"]}
    # The loaded f32 executable gave the f32 program's numbers to a bf16 program.
    assert bf16["cast"] == {
        "graph": "cast",
        "outcome": keyprobe.FAIL,
        "loaded": True,
        "same_module": False,
        "same_output": True,
    }
    # Same program, another key: the debug switch only adds metadata.
    assert probes["XLA_HLO_DEBUG"]["status"] == keyprobe.WARN
    assert check["figures"]["check_s"] > 0
    assert set(check["figures"]["lower_and_fingerprint_s"]) == set(_child_module().GRAPHS)


def test_stock_2_9_0_cannot_be_probed_because_its_cache_never_loads(gate_29: GateRun):
    check = gate_29.check("key-probe")
    assert not check["passed"]
    assert any("cache does not load" in r for r in check["reasons"])
    # The control ran alone first; after it, no other probe started.
    later = [p for p in check["figures"]["probes"] if p["probe"] != "control"]
    assert later and all(p["status"] == keyprobe.NOT_APPLICABLE for p in later)
    assert [run["name"] for run in check["runs"]] == ["cold", "control"]
