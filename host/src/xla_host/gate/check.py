"""The gate's ``Check`` protocol: what a check declares, so that a run is composed from data;
and what a check is given (:class:`GateConfig`, :class:`GateRun`).

A check lives in one module of this package and declares, as a :class:`Check`:

- its names (``--checks``, the report's rows), a family judged from one set of children
  having several (``cache-key`` and ``same-numbers``);
- the child runs it needs: the modes of ``child_workload.py`` its children run, or a
  child script of its own;
- the check whose runs it shares when both are chosen (:attr:`Check.shares`), and in
  which runs it may (:meth:`Check.shares_in`);
- how it judges: alone, in children of its own (:meth:`Check.run`), or from the runs of
  the check it shares (:meth:`Check.judge_shared`);
- its rows in ``xla-wheels compare`` (:class:`CompareRow`).

The registry (:mod:`xla_host.gate.checks`) lists the checks in the gate's order; the
names ``--checks`` takes and its default, the run's chains of children and compare's rows
are read from it. Adding a check is its module, one line in the registry, its tests and
its docs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from xla_host.cache_role import CacheRole
from xla_host.gate import slice as slices
from xla_host.gate import under_profile
from xla_host.gate.result import CheckResult
from xla_host.gate.target import Target
from xla_host.gate.workload import WorkloadSpec


@dataclass(frozen=True)
class GateConfig:
    """Everything one gate run needs, as ``xla-host gate`` (or the builder's ``xla-wheels
    gate``) parsed it."""

    python: Path | Callable[[], Path]
    """Interpreter of the environment to judge, or how to get one (the builder's cached
    stock environment, built on first use): a failure there is reported like the probe's."""
    device: str | None
    checks: tuple[str, ...]
    """A subset of the registry's checks (``xla_host.gate.checks.CHECKS``), in its order."""
    workload: WorkloadSpec
    child_timeout_s: float
    warm_runs: int
    max_warm_ratio: float
    baseline_tolerance: float
    baselines_dir: Path
    record_baseline: bool
    spmd: bool
    writers: int
    xla_cache_dir: Path | None
    keep_cache: bool
    upstream_tests: Path | None
    upstream_tests_revision: str | None
    out_dir: Path
    profile: under_profile.GateProfile | None
    settings: Mapping[str, Any]
    """The run's settings as report.json records them."""
    slice: slices.SliceSpec | None = None
    """This worker of a multi-host slice (None: one host, no slice)."""
    key_probes: tuple[Any, ...] = ()
    """The key-probe check's probes (``--key-probes``; the control always among them): its
    ``keyprobe.Probe`` rows, typed loosely here because that module declares a check."""
    pack_dir: Path | None = None
    """``--pack``: the restart check's cold cache is kept for a cache pack
    (:attr:`GateOutcome.cold_cache`), which the CLI writes after the receipt."""
    cache_role: CacheRole | None = None
    """This run's role on ``xla_cache_dir`` by the one rule (:mod:`xla_host.cache_role`;
    :func:`xla_host.gate.arguments.gate_config` decides it). None: the slice's (worker 0
    writes), else writer. A held writer lease still makes a writer a reader."""

    @property
    def runs_dir(self) -> Path:
        """Where the children's logs go: beside the reports, so an error can name one."""
        return self.out_dir / "runs"


@dataclass(frozen=True)
class GateRun:
    """What a check is given: the run's settings and the target it judges."""

    config: GateConfig
    """The run's settings, as the command line parsed them."""
    target: Target
    role: str
    """``writer`` or ``reader`` of the cache directory (a slice's worker other than 0, or a
    job that found the writer lease held, is a reader)."""
    scratch: Path
    """The run's scratch directory (removed when it ends); a check writes under
    ``scratch / <its name>``."""
    member: slices.Slice | None = None
    """This worker's place in a multi-host slice (None: one host)."""
    pack_keep: Path | None = None
    """``--pack``: where the restart check leaves a copy of its cold cache."""
    guests: tuple[str, ...] = ()
    """The checks of this run judged from this check's runs (their :attr:`Check.shares`
    names it), for a check that must prepare them (keep its cold cache, query HBM)."""

    @property
    def runs_dir(self) -> Path:
        return self.config.runs_dir

    @property
    def timeout_s(self) -> float:
        return self.config.child_timeout_s

    @property
    def kept_cold_cache(self) -> Path:
        """Where the restart check copies the cache its cold run left, for its guests."""
        return self.scratch / "restart-cold-cache"


class Figures(Protocol):
    """What a compare row reads: a receipt (``xla_host.receipts.Receipt``)."""

    def figure(self, check: str, key: str) -> Any: ...

    def check(self, name: str) -> Any: ...


@dataclass(frozen=True)
class CompareRow:
    """One row of ``xla-wheels compare``: its label and its value in a receipt."""

    label: str
    value: Callable[[Figures], str]


def figure_row(label: str, check: str, key: str, fmt: str = "{}") -> CompareRow:
    """A row showing one figure of ``check`` (``-`` when absent)."""

    def value(receipt: Figures) -> str:
        found = receipt.figure(check, key)
        return "-" if found is None else fmt.format(found)

    return CompareRow(label, value)


def verdict_row(label: str, check: str) -> CompareRow:
    """A row showing ``check``'s verdict: PASS, FAIL, measured, or not run."""

    def value(receipt: Figures) -> str:
        found = receipt.check(check)
        if found is None:
            return "not run"
        return {True: "PASS", False: "FAIL", None: "measured"}[found.passed]

    return CompareRow(label, value)


class Check(Protocol):
    """A check of the gate, as the registry lists it (see the module docstring)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    @property
    def child_runs(self) -> tuple[str, ...]:
        """The ``child_workload.py`` modes its children run, or ``<script>.py`` for a
        child script of its own."""
        ...

    @property
    def shares(self) -> str | None:
        """The check whose runs it is judged from when both are chosen (None: none)."""
        ...

    @property
    def compare_rows(self) -> tuple[CompareRow, ...]: ...

    def shares_in(self, run: GateRun) -> bool:
        """Whether, in ``run``, it is judged from the runs of :attr:`shares`."""
        ...

    def run(self, run: GateRun, names: tuple[str, ...]) -> list[CheckResult]:
        """Judge ``names`` (the chosen ones of :attr:`names`) in children of its own."""
        ...

    def judge_shared(
        self, run: GateRun, names: tuple[str, ...], host: CheckResult
    ) -> list[CheckResult]:
        """Judge ``names`` from the finished ``host`` check's runs."""
        ...


@dataclass(frozen=True)
class Declared:
    """A :class:`Check` made of its parts: what most check modules declare."""

    names: tuple[str, ...]
    child_runs: tuple[str, ...]
    judge: Callable[[GateRun, tuple[str, ...]], list[CheckResult]]
    """How it judges alone (:meth:`Check.run`)."""
    shares: str | None = None
    sharing: Callable[[GateRun], bool] | None = None
    """In which runs it shares (:meth:`Check.shares_in`; None: whenever both run)."""
    judge_from: Callable[[GateRun, tuple[str, ...], CheckResult], list[CheckResult]] | None = None
    """How it judges from the shared runs (:meth:`Check.judge_shared`)."""
    compare_rows: tuple[CompareRow, ...] = ()

    def shares_in(self, run: GateRun) -> bool:
        return self.shares is not None and (self.sharing is None or self.sharing(run))

    def run(self, run: GateRun, names: tuple[str, ...]) -> list[CheckResult]:
        return self.judge(run, names)

    def judge_shared(
        self, run: GateRun, names: tuple[str, ...], host: CheckResult
    ) -> list[CheckResult]:
        if self.judge_from is None:
            raise TypeError(f"{', '.join(self.names)} shares no runs")
        return self.judge_from(run, names, host)
