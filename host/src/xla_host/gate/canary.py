"""The recompilation canary: a steady training step compiles nothing and reads nothing back.

A training loop that recompiles every step, or waits for a device-to-host copy every step,
still trains; it is just many times slower, and nothing fails until someone reads a
profile. The canary runs a small AdamW training step (``child_workload.py --mode canary``) whose
per-step scalars are device tensors (the learning rate, and AdamW's step count with
``capturable=True``), ``WARMUP`` steps to compile, then ``STEPS`` measured steps, and
judges what torch_xla's metrics saw during the measured steps (``judge_run``, a pure
function of the child's counter snapshots):

* compiles: the ``CompileTime`` metric gets one sample per real XLA compilation (the PJRT
  client's Compile, ``runtime/computation_client.cpp``); ``UncachedCompile`` counts
  in-memory graph-cache misses (``XLAGraphExecutor::LookupCachedCompile``). Both must
  stay still;
* device-to-host transfers: ``TransferFromDeviceTime`` gets one sample per
  ``PjRtComputationClient::TransferFromDevice``; ``aten::_local_scalar_dense`` counts
  ``.item()`` and ``float(tensor)`` (torch_xla has no lowering for it and counts it as a
  CPU fallback, ``aten_xla_type.cpp``). Both must stay still.

Host-to-device transfers (``TransferToDeviceTime``) are reported, not judged: a new
input batch is one every step in any real loop.

The check proves it can fail: two controls run the same step with one defect each, and
each must be caught naming the counter that moved. ``item-readback`` calls
``loss.item()`` every step (measured on stock 2.7.0 and 2.9.0: ``TransferFromDeviceTime``
and ``aten::_local_scalar_dense`` +1 per step); ``shape-drift`` grows the batch by one row
every step (``CompileTime`` and ``UncachedCompile`` +1 per step). A control that moves
nothing fails the check: a canary that cannot fail proves nothing.

How Python scalars reach the graph (torch_xla v2.9.0, read in its source): a Python number
used in an op goes through ``XLAGraphExecutor::GetIrValueForScalar``
(``torch_xla/csrc/xla_graph_executor.cpp``). If ``torch::lazy::IsSpecialScalar(value)``
holds, it becomes a ``ScalarOp``, a constant baked into the graph, so the graph hash,
and with it the compiled executable, depends on the value; otherwise it becomes device
data (``GetDeviceDataIrValue`` -> ``LazyGraphExecutor::GetDeviceData``, cached by value in
PyTorch's device-data cache), a graph parameter: no recompile when the value changes, but
a host-to-device transfer for every value the cache has not seen. A zero-dimensional CPU
tensor moved to the device takes the same route (``XLATensor::GetIrValueForTensor``,
``torch_xla/csrc/tensor.cpp``). ``IsSpecialScalar`` is PyTorch's
(``torch/csrc/lazy/core/tensor_util.h``): true only while
``FLAGS_torch_lazy_handle_special_scalars`` is set, which torch_xla clears when
``XLA_NO_SPECIAL_SCALARS=1`` (``MapXlaEnvVarsToLazy``,
``torch_xla/csrc/init_python_bindings.cpp``). By default the special values are 0 and
+-1 (and every number under ``FLAGS_torch_lazy_all_numbers_special_scalars``; the rule's
body is in PyTorch's ``tensor_util.cpp``, which was not read here). So a schedule that
passes a Python float learning rate recompiles whenever the value crosses into or out of
that set, and pays a transfer for every new value even without recompiling; a device
tensor updated on the device pays neither, which is what the steady variant shows. The
gate runs every child with ``XLA_NO_SPECIAL_SCALARS=1`` (``children.runtime_env``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_host import log
from xla_host.gate.check import Declared, GateRun, verdict_row
from xla_host.gate.children import run_child, runtime_env
from xla_host.gate.result import CheckResult
from xla_host.gate.target import Target

NAME = "recompile-canary"
WORKLOAD = "steady"
#: Each control and the kind of counter that must catch it.
CONTROLS = {"item-readback": "device-to-host", "shape-drift": "compile"}
#: The order they run in, in one process: the steady step first, so no control can mask it.
VARIANTS = (WORKLOAD, *CONTROLS)
#: What is judged: (section of the snapshot, name) per kind of per-step cost.
JUDGED: dict[str, tuple[tuple[str, str], ...]] = {
    "compile": (("metrics", "CompileTime"), ("counters", "UncachedCompile")),
    "device-to-host": (
        ("metrics", "TransferFromDeviceTime"),
        ("counters", "aten::_local_scalar_dense"),
    ),
}
#: Reported next to the verdict, not judged (see the module docstring).
REPORTED = (("metrics", "TransferToDeviceTime"), ("metrics", "ExecuteTime"))
WARMUP = 3
STEPS = 8


@dataclass(frozen=True)
class RunVerdict:
    """One variant's measured steps: which judged counters moved, by how much."""

    variant: str
    steps: int
    moved: dict[str, dict[str, int]]
    """Kind ("compile", "device-to-host") -> counter name -> increase over the steps."""
    warmup_compiles: int
    reported: dict[str, int]
    error: str | None = None

    @property
    def clean(self) -> bool:
        return self.error is None and not any(self.moved.values())

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.variant} did not finish: {self.error}"
        if self.clean:
            return f"{self.variant}: nothing compiled or read back in {self.steps} steps"
        parts = [
            f"{name} +{delta} in {self.steps} steps ({kind})"
            for kind, names in self.moved.items()
            for name, delta in names.items()
        ]
        return f"{self.variant}: " + ", ".join(parts)


def _value(snapshot: dict[str, Any], section: str, name: str) -> int:
    return int(snapshot.get(section, {}).get(name, 0))


def judge_run(report: dict[str, Any] | None, failure: str | None, variant: str) -> RunVerdict:
    """What moved between the end of the warm-up and the end of the measured steps."""
    if report is None or not report.get("ok"):
        return RunVerdict(variant, 0, {}, 0, {}, error=failure or "no report")
    snapshots = report["snapshots"]
    set_up, warm, done = (snapshots[k] for k in ("set_up", "after_warmup", "after_steps"))
    moved: dict[str, dict[str, int]] = {}
    for kind, names in JUDGED.items():
        deltas = {
            name: _value(done, section, name) - _value(warm, section, name)
            for section, name in names
        }
        moved[kind] = {name: delta for name, delta in deltas.items() if delta}
    return RunVerdict(
        variant,
        int(report.get("steps", 0)),
        moved,
        _value(warm, "metrics", "CompileTime") - _value(set_up, "metrics", "CompileTime"),
        {
            name: _value(done, section, name) - _value(warm, section, name)
            for section, name in REPORTED
        },
    )


def judge_canary(verdicts: dict[str, RunVerdict]) -> CheckResult:
    """The check: the steady step is clean, and each control is caught by its own counter."""
    reasons: list[str] = []
    notes: list[str] = []
    steady = verdicts[WORKLOAD]
    if not steady.clean:
        reasons.append(steady.describe())
    if steady.error is None and steady.warmup_compiles == 0:
        # Without a compile in the warm-up the counters do not see this build's compiles,
        # and a still CompileTime would prove nothing.
        reasons.append(f"{WORKLOAD}: the warm-up compiled nothing (CompileTime did not move)")
    for control, kind in CONTROLS.items():
        verdict = verdicts[control]
        if verdict.error is not None:
            reasons.append(f"control {verdict.describe()}")
        elif verdict.moved.get(kind):
            notes.append(f"control fails as it must: {verdict.describe()}")
        else:
            reasons.append(
                f"control {control} was not caught: no {kind} counter moved "
                f"({verdict.describe()}); the canary cannot fail on this build"
            )
    figures: dict[str, Any] = {
        variant: {
            "steps": v.steps,
            "warmup_compiles": v.warmup_compiles,
            "moved": v.moved,
            "reported": v.reported,
            **({"error": v.error} if v.error else {}),
        }
        for variant, v in verdicts.items()
    }
    if steady.clean:
        notes.insert(0, steady.describe())
        if steady.reported.get("TransferToDeviceTime"):
            notes.append(
                f"{WORKLOAD}: {steady.reported['TransferToDeviceTime']} host-to-device "
                "transfer(s) in the measured steps (reported, not judged)"
            )
    return CheckResult(NAME, not reasons, reasons, notes, figures)


def run_canary_check(target: Target, runs_dir: Path, *, timeout_s: float = 600.0) -> CheckResult:
    """Run the steady variant, then both controls, in one fresh process, and judge them."""
    began = time.monotonic()
    # No persistent cache: the canary is about the steady state of one process.
    env = runtime_env(target.device)
    # One process for the three variants saves two torch_xla imports. The steady variant
    # runs first, so no control's compiles or transfers come before it; each control is
    # judged on its own steps' counters, which what ran before it does not move.
    with log.section(f"{NAME}: {', '.join(VARIANTS)}, {WARMUP} warm-up + {STEPS} measured steps"):
        args = ["--mode", "canary", "--warmup", str(WARMUP), "--steps", str(STEPS)]
        for variant in VARIANTS:
            args += ["--variant", variant]
        child = run_child(target.python, NAME, runs_dir / NAME, args, env, timeout_s)
    reported = {run["variant"]: run for run in (child.report or {}).get("variants", [])}
    failure = None if child.ok else child.failure()
    result = judge_canary(
        {variant: judge_run(reported.get(variant), failure, variant) for variant in VARIANTS}
    )
    result.runs = [child.row()]
    result.duration_s = time.monotonic() - began
    return result


def _judge(run: GateRun, names: tuple[str, ...]) -> list[CheckResult]:
    return [run_canary_check(run.target, run.runs_dir, timeout_s=run.timeout_s)]


#: As the gate's registry lists it (xla_host.gate.checks).
CHECK = Declared(
    names=(NAME,),
    child_runs=("canary",),
    judge=_judge,
    compare_rows=(verdict_row("recompile canary", NAME),),
)
