"""The recompilation canary: a steady AdamW step compiles nothing and reads nothing back.

The verdict rules run first on reports shaped as ``child_workload.py --mode canary`` writes
them, with the counter movements measured on stock torch_xla (fast); then the real check runs on
stock torch_xla 2.9.0 and 2.7.0 on CPU, where the steady step must pass and both controls
must be caught by the counter that moves.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.gate_helpers import GateRun
from xla_host.gate import canary

STEPS = 8


def snapshot(compiles: int = 0, uncached: int = 0, d2h: int = 0, scalar_reads: int = 0) -> dict:
    return {
        "counters": {
            "UncachedCompile": uncached,
            "aten::_local_scalar_dense": scalar_reads,
            "MarkStep": 11,
        },
        "metrics": {
            "CompileTime": compiles,
            "TransferFromDeviceTime": d2h,
            "TransferToDeviceTime": 5,
            "ExecuteTime": 3,
        },
    }


def report(after_steps: dict, *, after_warmup: dict | None = None) -> dict[str, Any]:
    return {
        "ok": True,
        "steps": STEPS,
        "snapshots": {
            "set_up": snapshot(),
            "after_warmup": after_warmup or snapshot(compiles=2, uncached=2),
            "after_steps": after_steps,
        },
    }


#: What stock 2.7.0 and 2.9.0 show after 3 warm-up and 8 measured steps (see the module).
STEADY = report(snapshot(compiles=2, uncached=2))
ITEM_READBACK = report(snapshot(compiles=2, uncached=2, d2h=STEPS, scalar_reads=STEPS))
SHAPE_DRIFT = report(snapshot(compiles=2 + STEPS, uncached=2 + STEPS))


def verdicts(**reports: dict[str, Any]) -> dict[str, canary.RunVerdict]:
    chosen = {"steady": STEADY, "item-readback": ITEM_READBACK, "shape-drift": SHAPE_DRIFT}
    chosen.update({name.replace("_", "-"): value for name, value in reports.items()})
    return {name: canary.judge_run(value, None, name) for name, value in chosen.items()}


# --- The verdict ------------------------------------------------------------------------


def test_a_steady_step_and_two_caught_controls_pass():
    result = canary.judge_canary(verdicts())
    assert result.passed, result.reasons
    assert result.notes[0] == "steady: nothing compiled or read back in 8 steps"
    assert any("item-readback: TransferFromDeviceTime +8" in note for note in result.notes)
    assert any("shape-drift: CompileTime +8" in note for note in result.notes)


def test_a_step_that_reads_back_fails_naming_the_transfer_counters():
    result = canary.judge_canary(verdicts(steady=ITEM_READBACK))
    assert not result.passed
    assert result.reasons == [
        "steady: TransferFromDeviceTime +8 in 8 steps (device-to-host), "
        "aten::_local_scalar_dense +8 in 8 steps (device-to-host)"
    ]


def test_a_step_whose_shape_drifts_fails_naming_the_compile_counters():
    result = canary.judge_canary(verdicts(steady=SHAPE_DRIFT))
    assert not result.passed
    assert "CompileTime +8 in 8 steps (compile)" in result.reasons[0]
    assert "UncachedCompile +8" in result.reasons[0]


def test_one_compile_after_warm_up_is_already_a_failure():
    result = canary.judge_canary(verdicts(steady=report(snapshot(compiles=3, uncached=2))))
    assert result.reasons == ["steady: CompileTime +1 in 8 steps (compile)"]


def test_a_control_that_moves_nothing_fails_the_check_the_canary_is_blind():
    result = canary.judge_canary(verdicts(item_readback=STEADY))
    assert not result.passed
    assert result.reasons == [
        "control item-readback was not caught: no device-to-host counter moved "
        "(item-readback: nothing compiled or read back in 8 steps); the canary cannot fail "
        "on this build"
    ]


def test_a_control_caught_only_by_the_other_kind_of_counter_is_not_caught():
    # A readback control that recompiles but transfers nothing is not the defect it stands for.
    result = canary.judge_canary(verdicts(item_readback=SHAPE_DRIFT))
    assert not result.passed
    assert result.reasons[0].startswith("control item-readback was not caught")


def test_a_warm_up_that_compiled_nothing_means_the_counters_are_blind():
    blind = report(snapshot(), after_warmup=snapshot())
    result = canary.judge_canary(verdicts(steady=blind))
    assert result.reasons == ["steady: the warm-up compiled nothing (CompileTime did not move)"]


def test_a_child_that_did_not_finish_fails_with_its_error():
    verdict = canary.judge_run(None, "steady: exited 3 without a report", "steady")
    result = canary.judge_canary({**verdicts(), "steady": verdict})
    assert result.reasons == ["steady did not finish: steady: exited 3 without a report"]


def test_host_to_device_transfers_are_reported_not_judged():
    result = canary.judge_canary(
        verdicts(steady=report(snapshot(compiles=2, uncached=2) | {"metrics": {
            "CompileTime": 2, "TransferToDeviceTime": 5 + STEPS}}))
    )  # fmt: skip
    assert result.passed, result.reasons
    assert "steady: 8 host-to-device transfer(s) in the measured steps (reported, not judged)" in (
        result.notes
    )


# --- Real stock torch_xla on CPU --------------------------------------------------------


# The canary's own verdict in the two stock gate runs made once per pytest run
# (tests/conftest.py): every check ran there, the canary side by side with the others.


def _assert_passes_with_its_controls_caught(run: GateRun) -> None:
    check = run.check(canary.NAME)
    assert check["passed"], check["reasons"]
    figures = check["figures"]
    steady = figures["steady"]
    assert steady["warmup_compiles"] >= 1
    assert steady["moved"] == {"compile": {}, "device-to-host": {}}
    # Each control is caught by exactly its own kind of counter, once per measured step.
    readback = figures["item-readback"]["moved"]
    assert readback == {
        "compile": {},
        "device-to-host": {"TransferFromDeviceTime": STEPS, "aten::_local_scalar_dense": STEPS},
    }
    drift = figures["shape-drift"]["moved"]
    assert drift == {
        "compile": {"CompileTime": STEPS, "UncachedCompile": STEPS},
        "device-to-host": {},
    }
    assert "control fails as it must: item-readback: TransferFromDeviceTime +8" in run.stdout
    assert f"[PASS] {canary.NAME}" in run.stdout


@pytest.mark.slow
def test_stock_2_9_0_passes_the_canary_and_its_controls_are_caught(gate_29: GateRun):
    _assert_passes_with_its_controls_caught(gate_29)


@pytest.mark.slow
def test_stock_2_7_0_passes_the_canary_and_its_controls_are_caught(gate_27: GateRun):
    _assert_passes_with_its_controls_caught(gate_27)


@pytest.mark.slow
def test_the_steady_step_really_ran_adamw_with_a_tensor_learning_rate(gate_29: GateRun):
    # One process ran the three variants, the steady one first.
    child_report = gate_29.out_dir / "runs" / canary.NAME / f"{canary.NAME}.json"
    child = json.loads(child_report.read_text())
    ran = [run["variant"] for run in child["variants"]]
    assert ran == ["steady", "item-readback", "shape-drift"]
    steady = child["variants"][0]
    assert steady["lr_is_tensor"] is True
    # The schedule ran on the device: 1e-3 decayed by 0.99 for 3 + 8 steps.
    assert steady["final_learning_rate"] == pytest.approx(1e-3 * 0.99**11, rel=1e-5)
