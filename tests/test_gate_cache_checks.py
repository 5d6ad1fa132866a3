"""Key safety, same numbers, the SPMD warm restart and upstream's test on real stock wheels.

Controls (CPU, real torch_xla from PyPI):
- stock 2.7.0, whose cache works, passes cache-key and same-numbers;
- stock 2.7.0 as is hangs on an SPMD warm restart (an XLA:CPU bug at its OpenXLA pin: a
  loaded executable's all-reduces lose their order). The gate must report the hang within
  a bound derived from the cold run, with gdb's native stacks: the hang detector's
  negative control;
- stock 2.7.0 with ``XLA_FLAGS=--xla_cpu_use_thunk_runtime=false`` (the old runtime, which
  does not rebuild thunks on load) passes the SPMD variant with cache hits: its positive
  control;
- stock 2.9.0 fails (test_gate_stock.py: its cache never loads).

The stock 2.7.0 gate of every check runs once per pytest run (``gate_27``,
tests/conftest.py), shared with test_gate_stock.py; the tests read its report.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.gate_helpers import GateRun, run_gate_cli
from xla_host import receipts
from xla_host.gate import restart, upstream_tests
from xla_host.gate.target import resolve_target

UPSTREAM_REVISION = "c04e61c3424142c0eebcc9e59984b9d8fced18c0"
#: A gate run without a bundle leaves a receipt for no bundle's wheels.
BUNDLE_OF_NONE = "none"


@pytest.fixture(scope="module")
def gate_27_thunks_off(
    stock_xla_python_27: Path, tmp_path_factory: pytest.TempPathFactory
) -> GateRun:
    out = tmp_path_factory.mktemp("gate-27-thunks-off")
    # The default limit: the judged ratio is of the first sync's CPU time, which a busy
    # machine does not move (the whole first step's wall ratio once measured 0.75 here).
    return run_gate_cli(
        "gate", "--python", str(stock_xla_python_27), "--checks", "spmd-restart",
        out_dir=out / "report", env={"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=false"},
    )  # fmt: skip


def _variants(run: GateRun) -> dict[str, dict]:
    return {v["variant"]: v for v in run.check("cache-key")["figures"]["variants"]}


# --- key safety -----------------------------------------------------------------------------


def test_stock_2_7_0_passes_key_safety(gate_27: GateRun):
    check = gate_27.check("cache-key")
    assert check["passed"], check["reasons"]
    variants = _variants(gate_27)
    cold_misses = check["figures"]["cold_misses"]
    assert cold_misses >= 1
    for name in ("warm-same", "warm-dump"):
        assert variants[name]["status"] == "pass"
        assert variants[name]["hits"] == cold_misses and variants[name]["xla_compiles"] == 0
    fast_math = variants["warm-fast-math"]
    assert fast_math["status"] == "pass"
    assert fast_math["hits"] == 0 and fast_math["xla_compiles"] >= 1
    # The restart check's cold and first warm run served as cold and warm-same (one run each).
    shared = {run["name"]: run.get("same_run_as") for run in check["runs"]}
    assert shared["cold"] == "restart: cold-1" and shared["warm-same"] == "restart: warm-1"
    cache_runs = gate_27.out_dir / "runs" / "cache-checks"
    own_children = sorted(p.stem for p in cache_runs.glob("*.json"))
    assert own_children == ["sharded-cold", "sharded-warm", "warm-dump", "warm-fast-math"]


def test_a_custom_option_variant_is_not_applicable_on_2_7_0_not_passed(gate_27: GateRun):
    custom = _variants(gate_27)["warm-custom-option"]
    assert custom["status"] == "not applicable"
    assert "no torch_xla.set_custom_compile_options" in custom["reason"]
    assert "NOT APPLICABLE  warm-custom-option" in gate_27.stdout


def test_stock_2_7_0_gives_the_same_numbers_after_a_cache_hit(gate_27: GateRun):
    check = gate_27.check("same-numbers")
    assert check["passed"], check["reasons"]
    assert check["figures"]["compared"] == ["warm-same", "warm-dump"]
    assert len(check["figures"]["cold_loss_hex"]) == 3
    # The spmd_sharded case: the output stays sharded over the four CPU devices.
    assert check["figures"]["sharding_spec"] == "{devices=[4]0,1,2,3}"
    assert check["figures"]["sharded_hits"] >= 1


# --- SPMD warm restart: negative and positive controls -------------------------------------


def test_stock_2_7_0_spmd_warm_restart_is_reported_as_hung_with_native_stacks(gate_27: GateRun):
    check = gate_27.check("spmd-restart")
    assert gate_27.exit_code == 1
    hung = [run for run in check["runs"] if run.get("timed_out")]
    if not hung and check["passed"]:
        # The hang is XLA:CPU's race, likely in three loaders of 8 steps, not certain
        # (gate/README.md, "The SPMD warm restart"): on one machine it stopped reproducing
        # for a while, with the gate's code before and after a change to its children
        # alike. Said, not passed: the detection was not exercised in this run.
        pytest.xfail("stock 2.7.0's SPMD warm-restart hang did not reproduce in this run")
    assert not check["passed"]
    assert len(hung) == 1, check["runs"]  # no further loader starts after a hang
    run = hung[0]
    cold = next(r for r in check["runs"] if r["name"] == "cold-1")
    # Bounded by the cold run, not by the ten-minute child timeout...
    assert run["hang_bound_s"] == pytest.approx(3 * cold["wall_s"] + 30, abs=1)
    assert run["hang_bound_s"] < 600
    # ...and ended sooner still: on CPU its threads all wait, so it used no CPU time.
    assert run["stalled_s"] >= restart.RestartConfig().stall_s
    reason = next(r for r in check["reasons"] if r.startswith(f"{run['name']} hung"))
    assert f"used no CPU time for {run['stalled_s']:.0f}s" in reason
    if shutil.which("gdb"):
        stacks = Path(run["stacks"]).read_text()
        assert run["native_stacks"] == stacks  # carried in report.json itself
        assert "AllReduceThunk::Execute" in stacks
        assert run["stacks_summary"]["threads"] >= 4
        assert "native stacks of" in reason and "AwaitAndLogIfStuck" in reason
    else:
        assert "no native stacks: gdb is not installed" in reason


def test_stock_2_7_0_without_the_thunk_runtime_passes_the_spmd_warm_restart(
    gate_27_thunks_off: GateRun,
):
    check = gate_27_thunks_off.check("spmd-restart")
    assert check["passed"], check["reasons"]
    assert gate_27_thunks_off.exit_code == 0
    loaders = [r for r in check["runs"] if not r["name"].startswith("cold-")]
    assert [r["name"] for r in loaders] == ["warm-1", "warm-2", "read-only"]
    assert all(r["hits"] == check["figures"]["cold_misses"] >= 1 for r in loaders)
    assert all(len(r["loss_hex"]) >= restart.SPMD_MIN_STEPS for r in loaders)


def test_a_receipt_names_the_launch_environment_it_was_judged_under(
    gate_27_thunks_off: GateRun, gate_27: GateRun
):
    # A pass that needed the old XLA:CPU runtime and a run without it leave receipts that
    # say so: "a receipt must name everything it judged".
    thunks_off = receipts.read_receipt(gate_27_thunks_off.out_dir / "receipt.json").receipt
    plain = receipts.read_receipt(gate_27.out_dir / "receipt.json").receipt
    assert thunks_off.launch_environment is not None and plain.launch_environment is not None
    assert "--xla_cpu_use_thunk_runtime=false" in thunks_off.launch_environment["XLA_FLAGS"]
    assert "xla_cpu_use_thunk_runtime" not in plain.launch_environment.get("XLA_FLAGS", "")
    for environment in (thunks_off.launch_environment, plain.launch_environment):
        assert environment["PJRT_DEVICE"] == "CPU"
        assert environment["XLA_NO_SPECIAL_SCALARS"] == "1"
        # Each child's own cache is the gate's business, not the launch's.
        assert "XLA_PERSISTENT_CACHE_PATH" not in environment
    difference = receipts.environment_difference(thunks_off, plain)
    assert difference is not None and "XLA_FLAGS" in difference
    # Promotion compares them only under one launch environment: measured under other
    # XLA_FLAGS, the candidate's figures are not comparable with the lane's current ones.
    from xla_wheels.release import lanes, policy

    rule = lanes.Policy(max_memory_regression=0.10)
    flagged = receipts.read_receipt(gate_27_thunks_off.out_dir / "receipt.json")
    same = receipts.read_receipt(gate_27.out_dir / "receipt.json")
    verdict = policy.judge_promotion(BUNDLE_OF_NONE, set(), [flagged], rule, plain)
    memory = [f.detail for f in verdict.failures if f.rule == "memory"]
    assert memory and "launch environment XLA_FLAGS" in memory[0], verdict.failures
    like = policy.judge_promotion(BUNDLE_OF_NONE, set(), [same], rule, plain)
    assert not [f for f in like.failures if f.rule == "memory"], like.failures


# --- upstream's test_persistent_cache.py ----------------------------------------------------


@pytest.fixture(scope="module")
def torch_xla_src(pytorch_xla_repo: Path) -> Path:
    """A pytorch/xla repository to take test/test_persistent_cache.py from: TORCH_XLA_SRC or
    the shared snapshot (tests/real_source.py); without either these tests skip, in CI
    with the snapshot present they cannot."""
    return pytorch_xla_repo


@pytest.mark.parametrize(
    ("version", "expected_failures"),
    [
        ("2.7.0", set()),
        (
            "2.9.0",
            {
                "test_persistent_cache_single_device",
                "test_persistent_cache_spmd_replicated",
                "test_persistent_cache_spmd_sharded",
            },
        ),
    ],
)
# Its stock environment comes through getfixturevalue, which conftest's marking by fixture
# names cannot see: marked here.
@pytest.mark.stock_xla
def test_upstream_persistent_cache_test_on_cpu(
    version: str,
    expected_failures: set[str],
    torch_xla_src: Path,
    request: pytest.FixtureRequest,
    tmp_path: Path,
):
    python = request.getfixturevalue(f"stock_xla_python_{version.replace('.', '')[:2]}")
    target = resolve_target(python, "CPU", workdir=tmp_path / "probe")
    result = upstream_tests.run_upstream_test(
        target, torch_xla_src, tmp_path / "runs", revision=UPSTREAM_REVISION
    )
    cases = {c["case"]: c for c in result.figures["cases"]}
    assert set(cases) == {
        "test_persistent_cache_mp",
        "test_persistent_cache_single_device",
        "test_persistent_cache_spmd_replicated",
        "test_persistent_cache_spmd_sharded",
        "test_replicated_spmd_hash",
    }
    assert cases["test_persistent_cache_mp"]["status"] == "not applicable"
    failed = {name for name, c in cases.items() if c["status"] == "failed"}
    assert failed == expected_failures, cases
    assert result.passed is (not expected_failures)


def test_a_checkout_without_the_upstream_test_is_exit_2_before_any_check_runs(
    stock_xla_python_27: Path, tmp_path: Path
):
    empty = tmp_path / "not-pytorch-xla"
    empty.mkdir()
    run = run_gate_cli(
        "gate", "--python", str(stock_xla_python_27), "--checks", "restart",
        "--upstream-tests", str(empty), out_dir=tmp_path / "report",
    )  # fmt: skip
    assert run.exit_code == 2, run.stdout + run.stderr
    assert f"no test/test_persistent_cache.py in {empty}" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "report" / "runs" / "restart").exists()
