"""The gate's checks are one registry (``xla_host.gate.checks``): the names ``--checks``
takes and its default, the chains of children a run composes, the child runs each needs
and ``compare``'s rows are read from it. Adding a check is a module declaring it and one
line in the registry.

The chains are composed as data (:func:`plan`) and the same objects are run; these tests
read the plans (no torch_xla child starts). The gate tests marked stock_xla run them.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

from tests.test_gate_verdicts import CPU_TARGET, _gate_args
from xla_host import gate
from xla_host.gate import checks as registry
from xla_host.gate import child_workload, keyprobe
from xla_host.gate.check import Declared, GateRun, verdict_row
from xla_host.gate.checks import CHECKS, REGISTRY, plan
from xla_host.gate.result import CheckResult
from xla_wheels.cli import build_parser
from xla_wheels.release import compare

ALL = CHECKS


def _run(tmp_path: Path, role: str = "writer", **given: Any) -> GateRun:
    return GateRun(_gate_args(tmp_path, **given), CPU_TARGET, role, tmp_path / "scratch")


def _shown(run: GateRun, chosen: tuple[str, ...] = ALL) -> list[tuple[str, ...]]:
    return [chain.shown for chain in plan(run, chosen)]


def _declared_checks() -> list[Declared]:
    """Every check a module of the gate declares (a :class:`Declared` at its top level)."""
    found: list[Declared] = []
    for module in pkgutil.iter_modules(gate.__path__, f"{gate.__name__}."):
        if module.ispkg:
            continue
        values = vars(importlib.import_module(module.name)).values()
        found += [value for value in values if isinstance(value, Declared)]
    return found


def test_the_checks_are_the_registrys_in_its_order() -> None:
    # Every check a module declares is in the registry, once: a new check module that
    # forgot its line there fails here, not by going unjudged.
    declared = _declared_checks()
    assert declared and all(check in REGISTRY for check in declared)
    assert len(REGISTRY) == len(set(map(id, REGISTRY))) == len(declared)
    assert tuple(name for check in REGISTRY for name in check.names) == CHECKS
    assert len(set(CHECKS)) == len(CHECKS)
    # --checks takes them, every one by default.
    assert build_parser("gate").parse_args(["gate"]).checks == ",".join(CHECKS)


def test_a_writer_shares_the_restart_and_spmd_runs(tmp_path: Path) -> None:
    # The cache checks are judged from the restart check's cold and first warm run, the
    # HBM queries from the SPMD restart check's first cold run: two chains fewer.
    shown = _shown(_run(tmp_path))
    assert shown[:2] == [("restart", "cache-key", "same-numbers"), ("spmd-restart", "hbm")]
    # Every other check of the registry is a chain of its own, in the registry's order.
    judged = {name for chain in shown[:2] for name in chain}
    assert shown[2:] == [check.names for check in REGISTRY if not judged & set(check.names)]
    assert len(shown) == len(REGISTRY) - 2


def test_a_reader_or_an_spmd_run_or_several_writers_run_the_cache_checks_alone(
    tmp_path: Path,
) -> None:
    for run in (
        _run(tmp_path, role="reader"),
        _run(tmp_path, spmd=True),
        _run(tmp_path, writers=2),
    ):
        assert _shown(run)[:3] == [
            ("restart",), ("spmd-restart", "hbm"), ("cache-key", "same-numbers"),
        ]  # fmt: skip


def test_a_check_whose_host_is_not_chosen_runs_alone(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert _shown(run, ("cache-key", "hbm")) == [("cache-key",), ("hbm",)]
    assert _shown(run, ("restart", "same-numbers")) == [("restart", "same-numbers")]


def test_a_new_check_is_one_declaration_and_runs_as_declared(tmp_path: Path) -> None:
    # What a new module declares: its name, its child runs, how it judges, its rows. The
    # registry composes it like any other (here a registry of the real checks and it),
    # and runs exactly the plan it shows.
    judged: list[tuple[str, ...]] = []

    def judge(run: GateRun, names: tuple[str, ...]) -> list[CheckResult]:
        judged.append(names)
        return [CheckResult("new-check", True, [], ["judged"])]

    def from_canary(run: GateRun, names: tuple[str, ...], host: CheckResult) -> list[CheckResult]:
        return [CheckResult("after-canary", host.passed, [], [f"from {host.name}"])]

    new = Declared(("new-check",), ("canary",), judge, compare_rows=(verdict_row("new", "x"),))
    after = Declared(
        ("after-canary",), ("canary",), judge, shares="new-check", judge_from=from_canary
    )
    run = _run(tmp_path)
    chosen = ("key-probe", "new-check", "after-canary")
    chains = plan(run, chosen, (*REGISTRY, new, after))
    assert [chain.shown for chain in chains] == [("key-probe",), ("new-check", "after-canary")]
    (ran,) = registry.chains(run, ("new-check", "after-canary"), (*REGISTRY, new, after))
    results = ran()
    assert [(r.name, r.passed, r.notes) for r in results] == [
        ("new-check", True, ["judged"]),
        ("after-canary", True, ["from new-check"]),
    ]
    assert judged == [("new-check",)]


def test_every_child_run_a_check_declares_is_one_the_children_have() -> None:
    scripts = {keyprobe.CHILD.name}
    declared = {mode for check in REGISTRY for mode in check.child_runs}
    assert declared - scripts <= set(child_workload.MODES)
    assert declared & scripts == scripts
    # And every mode of the children is some check's, or the target probe's and the
    # restart benchmark's (which are no checks).
    assert set(child_workload.MODES) - declared == {"probe", "import"}


def test_compare_shows_every_checks_rows_from_the_registry() -> None:
    labels = [label for label, _ in compare._ROWS]
    for check in REGISTRY:
        for row in check.compare_rows:
            assert labels.count(row.label) == 1, row.label
    ours = [row.label for row in registry.compare_rows()]
    assert labels[-len(ours) :] == ours
    assert {"restart", "warm ready s", "recompile canary", "hbm", "HBM per chip"} <= set(ours)
