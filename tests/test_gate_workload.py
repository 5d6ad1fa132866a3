"""The gate on a team's own workload (``--workload file.py:factory``), and one it cannot judge.

Through the real runtime (stock torch_xla 2.7.0, whose persistent cache works on CPU):
- a tiny model written here, returned as a dataclass by a factory that imports a
  neighbour of its file, passes the restart check; its receipt names the workload, the
  sha256 of its file and its params (one gate run of the restart check, shared by the
  module's tests);
- a workload that breaks the protocol is named, never a traceback: each kind of problem
  as the child reports it (one process of the stock environment runs them all), the
  parent's verdict on such a report, and one gate run that stops at the probe with exit 2.

Without torch: how ``--workload`` is read (presets, files, modules, bad values).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.gate_helpers import run_gate_cli
from xla_host.gate import child_workload, recalibration, restart, workload
from xla_host.gate.children import ChildResult, runtime_env
from xla_host.gate.errors import GateEnvironmentError
from xla_host.values import BadValue

#: A neighbour module the workload file imports: its directory must be on sys.path.
LAYERS = """\
import torch


def mlp(width, hidden):
    return torch.nn.Sequential(
        torch.nn.Linear(width, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)
    )
"""

#: The team's workload: a dataclass (the child registers the module before it runs it).
TINY = """\
import dataclasses
from typing import Any

import torch

from tiny_layers import mlp


@dataclasses.dataclass
class Tiny:
    model: torch.nn.Module
    inputs: tuple
    step: Any
    steps: int
    params: dict


def build(device, mesh=None):
    torch.manual_seed(0)
    model = mlp(16, 32).to(device)
    # AdamW, as a team's decoder has it: its state is made by the first step, so the
    # second step is a second graph (time-to-ready must cover both).
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16).to(device), torch.randn(8, 1).to(device)

    def step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return Tiny(model, (x, y), step, 3, {"width": 16, "hidden": 32})
"""


def write_tiny(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tiny_layers.py").write_text(LAYERS)
    path = directory / "tiny_workload.py"
    path.write_text(TINY)
    return path


# --- a user's workload through the real runtime ----------------------------------------
# The team's own workload passing the restart check on stock 2.7.0, its runs' figures and
# its receipt (name, source digest, params) are asserted on the end-to-end run of
# tests/test_team_loop.py, which gates one through the host's command line on a slice:
# one gate run of a user's workload serves both.


# --- a workload that cannot be judged ----------------------------------------------------

BROKEN = """\
import torch


def raises(device):
    raise RuntimeError("no training data on this host")


def a_list(device):
    return [torch.nn.Linear(4, 1)]


def on_the_cpu(device):
    return {"model": torch.nn.Linear(4, 1), "inputs": (), "step": print, "steps": 1}


def _model(device):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(device)
    return model


def growing_batch(device):
    model = _model(device)
    return {
        "model": model,
        "inputs": lambda index: (torch.ones(2 + index, 4).to(device),),
        "step": lambda x: model(x).sum(),
        "steps": 3,
    }


def hidden_drift(device):
    model = _model(device)
    x = torch.ones(8, 4).to(device)
    calls = []

    def step(x):
        calls.append(1)
        return model(x[: len(calls)]).sum()  # the same input, another graph every step

    return {"model": model, "inputs": x, "step": step, "steps": 4}


def _adamw(device, width, **more):
    # AdamW creates its state (exp_avg, exp_avg_sq) in the first step: the second step is
    # another graph, the third the first of the steady state. The cases share one process
    # (and its in-memory graph cache): each has a width of its own, so graphs of its own.
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, y = torch.randn(8, width).to(device), torch.randn(8, 1).to(device)

    def step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return {"model": model, "inputs": (x, y), "step": step, "steps": 3, **more}


def adamw(device):
    return _adamw(device, 16)


def adamw_one_warmup(device):
    return _adamw(device, 24, warmup_steps=1)


def zero_warmup(device):
    return _adamw(device, 16, warmup_steps=0)


def no_steady_state(device):
    return _adamw(device, 16, warmup_steps=3)
"""

#: Runs ``child_workload.main`` once per case in one process of the environment under
#: test (one torch_xla import for all of them), each writing its own result document.
RUN_CASES = """\
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("child", sys.argv[1])
child = importlib.util.module_from_spec(spec)
spec.loader.exec_module(child)
for name, argv in json.loads(sys.argv[2]).items():
    child.PROGRESS.clear()
    child.main(argv)
"""


@pytest.fixture(scope="module")
def problems(stock_xla_python_27: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each broken factory's result document, as ``--mode train`` writes it."""
    directory = tmp_path_factory.mktemp("broken-workloads")
    broken = directory / "broken.py"
    broken.write_text(BROKEN)
    cases = {
        name: ["--mode", "train", "--out", str(directory / f"{name}.json"), *args]
        for name, args in {
            "missing": ["--workload-file", f"{broken}:nope"],
            "raises": ["--workload-file", f"{broken}:raises"],
            "a_list": ["--workload-file", f"{broken}:a_list"],
            "on_the_cpu": ["--workload-file", f"{broken}:on_the_cpu"],
            "no_module": ["--workload-module", "no_such_team_module:build"],
            "growing_batch": ["--workload-file", f"{broken}:growing_batch"],
            "hidden_drift": ["--workload-file", f"{broken}:hidden_drift"],
            "adamw_one_warmup": ["--workload-file", f"{broken}:adamw_one_warmup"],
            "zero_warmup": ["--workload-file", f"{broken}:zero_warmup"],
            "no_steady_state": ["--workload-file", f"{broken}:no_steady_state"],
            # Not broken: the AdamW model whose second step compiles, measured.
            "adamw": ["--workload-file", f"{broken}:adamw"],
        }.items()
    }
    env = runtime_env("CPU")  # the policy every gate child runs under
    process = subprocess.run(
        [str(stock_xla_python_27), "-c", RUN_CASES, child_workload.__file__, json.dumps(cases)],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr[-3000:]
    docs = {name: json.loads((directory / f"{name}.json").read_text()) for name in cases}
    return {"docs": docs, "stderr": process.stderr, "directory": directory}


@pytest.mark.parametrize(
    ("case", "problem"),
    [
        ("missing", "broken.py has no factory nope (it defines: a_list, adamw, "
         "adamw_one_warmup, growing_batch, hidden_drift, no_steady_state, on_the_cpu, "
         "raises, zero_warmup)"),
        ("raises", "its factory raised RuntimeError: no training data on this host"),
        ("a_list", "its factory returned a list without model, inputs, step, steps"),
        ("on_the_cpu", "model has parameters on cpu, not on the XLA device"),
        ("no_module", "module no_such_team_module is not importable in"),
        ("growing_batch", "shapes change between steps: step 2 has {'inputs': [[3, 4]]"),
        ("hidden_drift", "new graph(s) after 2 warm-up steps (torch_xla compiled or loaded "
         "a graph it had not run"),
        # The workload said one warm-up step; AdamW's second step is a new graph.
        ("adamw_one_warmup", "step 2 brought 1 new graph(s) after 1 warm-up steps"),
        ("zero_warmup", "warmup_steps is 0, not an int >= 1"),
        ("no_steady_state", "steps (3) must exceed warmup_steps (3)"),
    ],
)  # fmt: skip
def test_the_child_names_what_makes_a_workload_unjudgeable(
    problems: dict, case: str, problem: str
) -> None:
    doc = problems["docs"][case]
    assert doc["ok"] is False
    if case == "hidden_drift":
        assert doc["workload_problem"].startswith("step 3 brought ")
    assert problem in doc["workload_problem"], doc["workload_problem"]
    # The traceback is evidence for the log, printed there (stderr), and in the document.
    assert "Traceback" in doc["traceback"]


def test_time_to_ready_covers_both_graphs_of_an_adamw_model_and_its_parts_add_up(
    problems: dict,
) -> None:
    # Stock 2.7.0: AdamW's first step compiles one graph, its second (the optimizer state
    # now exists) another, its third none. Ready is the end of step 2, not step 1.
    doc = problems["docs"]["adamw"]
    assert doc["ok"], doc.get("error")
    ready = doc["ready"]
    assert (ready["steps"], ready["graphs"], ready["compiles"]) == (2, 2, 2)
    assert ready["steady_state_step"] == 3
    assert ready["ready_s"] == doc["ready_s"] > sum(doc["step_times_s"][:1])
    phases = recalibration.run_breakdown(doc)
    # Every part is a part: none negative, none clamped, compile within the syncs.
    assert all(v is None or v >= 0 for v in phases.values()), phases
    assert phases["compile"] <= ready["sync_s"] <= ready["ready_s"]
    total = sum(v or 0.0 for k, v in phases.items() if k != "import")
    assert abs(total - ready["ready_s"]) < 1e-6, (total, ready["ready_s"])
    # The steady state is judged on the steps after the warm-up.
    assert doc["steady_step_s"] == max(doc["step_times_s"][2:])


def test_the_child_says_it_is_in_the_workloads_factory_while_it_runs(problems: dict) -> None:
    # What the parent reads when it kills a child that hung there (gate/children.py).
    phase = (problems["directory"] / "raises.json.phase").read_text()
    assert phase.startswith("the workload's factory (") and phase.rstrip().endswith(":raises)")
    assert (problems["directory"] / "adamw.json.phase").read_text() == "the training steps\n"


def test_the_traceback_goes_to_the_childs_log(problems: dict) -> None:
    assert "RuntimeError: no training data on this host" in problems["stderr"]
    assert "WorkloadProblem: its factory raised RuntimeError" in problems["stderr"]


def test_a_training_run_that_found_a_problem_makes_the_gate_unable_to_judge(
    problems: dict, tmp_path: Path
) -> None:
    log = tmp_path / "cold-1.log"
    doc = problems["docs"]["growing_batch"]
    row = restart.summarize(ChildResult("cold-1", 3, 1.0, doc, log))
    with pytest.raises(GateEnvironmentError) as caught:
        workload.refuse_unjudgeable("broken.py:growing_batch", [row])
    assert caught.value.exit_code == 2
    message = str(caught.value)
    assert message.startswith("workload broken.py:growing_batch cannot be judged: shapes change")
    assert str(log) in message


def test_a_factory_that_raises_stops_the_gate_at_the_probe_with_exit_2(
    stock_xla_python_27: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN)
    run = run_gate_cli(
        "gate", "--python", str(stock_xla_python_27), "--workload", f"{broken}:raises",
        "--checks", "restart", out_dir=tmp_path / "report",
    )  # fmt: skip
    assert run.exit_code == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    log = tmp_path / "report" / "runs" / "probe-cpu.log"
    assert (
        "error: workload broken.py:raises cannot be judged: its factory raised RuntimeError: "
        f"no training data on this host (the child's log, with any traceback: {log})"
    ) in run.stderr
    assert "Your own workload" in run.stderr  # the fix names the protocol
    assert "Traceback" in log.read_text()
    assert run.report["exit_code"] == 2
    assert not (tmp_path / "report" / "runs" / "restart").exists()  # no check started


# --- reading --workload --------------------------------------------------------------------


def test_a_preset_is_the_presets_file_loaded_like_any_other() -> None:
    small = workload.resolve("small")
    assert small.name == "small" and small.preset
    assert small.child_args() == [
        "--workload-file", f"{workload.PRESETS_FILE}:small", "--workload-name", "small",
    ]  # fmt: skip


def test_a_file_is_named_by_its_base_name_and_factory(tmp_path: Path) -> None:
    path = write_tiny(tmp_path)
    given = workload.resolve("tiny_workload.py:build", cwd=tmp_path)
    assert (given.name, given.reference) == ("tiny_workload.py:build", f"{path}:build")
    default = workload.resolve(str(path))
    assert default.name == f"tiny_workload.py:{workload.DEFAULT_FACTORY}"
    assert not default.preset


def test_a_module_is_passed_to_the_child_by_name() -> None:
    given = workload.resolve("team.models.llama:build")
    assert given.child_args() == [
        "--workload-module", "team.models.llama:build", "--workload-name", "team.models.llama:build"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("huge", "is not a workload: give a preset (small, medium, large)"),
        ("team.models", "is not a workload"),
        ("nowhere/model.py", "is not a workload: there is no file"),
        ("model.py:not-a-name", "names no factory: 'not-a-name' is not a Python identifier"),
    ],
)
def test_a_value_that_names_no_workload_is_refused(text: str, reason: str, tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("")
    with pytest.raises(BadValue) as caught:
        workload.resolve(text, cwd=tmp_path)
    assert caught.value.reason.startswith(reason), caught.value.reason


def test_a_workload_path_that_is_no_file_says_what_is_there(tmp_path: Path) -> None:
    (tmp_path / "models.py").mkdir()
    os.mkfifo(tmp_path / "pipe.py")
    for name, what in (("models.py", "is a directory"), ("pipe.py", "is a FIFO")):
        with pytest.raises(BadValue) as caught:
            workload.resolve(name, cwd=tmp_path)
        reason = caught.value.reason
        assert f"{tmp_path / name} {what}, not a Python file" in reason, reason
        assert "there is no file" not in reason, reason
