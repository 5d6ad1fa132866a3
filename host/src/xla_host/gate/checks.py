"""The gate's checks, in its order: the one list everything about them is read from.

:data:`REGISTRY` holds each check's :class:`xla_host.gate.check.Check`; from it come
:data:`CHECKS` (the names ``--checks`` takes, its default, the report's order), the run's
chains of children (:func:`chains`) and ``xla-wheels compare``'s rows (:func:`compare_rows`).
A new check is a module declaring its ``CHECK`` and one line here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from xla_host.gate import cachekeys, canary, hbm, keyprobe, restart
from xla_host.gate.check import Check, CompareRow, GateRun
from xla_host.gate.result import CheckResult

REGISTRY: tuple[Check, ...] = (
    restart.CHECK,
    restart.SPMD_CHECK,
    cachekeys.CHECK,
    keyprobe.CHECK,
    hbm.CHECK,
    canary.CHECK,
)

#: Every check's name, in the gate's order.
CHECKS: tuple[str, ...] = tuple(name for check in REGISTRY for name in check.names)

Chain = Callable[[], list[CheckResult]]


@dataclass(frozen=True)
class ChainPlan:
    """One chain of children: a check judged in children of its own, then the checks
    judged from its runs (each with the name of its check whose runs it shares)."""

    check: Check
    names: tuple[str, ...]
    guests: tuple[tuple[str, Check, tuple[str, ...]], ...] = ()

    @property
    def shown(self) -> tuple[str, ...]:
        """Every check name it judges, in the order it judges them."""
        return (*self.names, *(name for _, _, names in self.guests for name in names))


def plan(
    run: GateRun, chosen: tuple[str, ...], registry: Sequence[Check] = REGISTRY
) -> list[ChainPlan]:
    """The independent chains of children that judge ``chosen``, composed before any
    runs: a check judged from another's runs (its :attr:`~Check.shares`, when that one is
    chosen and :meth:`~Check.shares_in` this run) joins that check's chain, after it;
    every other check is a chain of its own, in the registry's order."""
    picked = [(check, tuple(n for n in check.names if n in chosen)) for check in registry]
    picked = [(check, names) for check, names in picked if names]
    guests: dict[str, list[tuple[str, Check, tuple[str, ...]]]] = {}
    alone: list[tuple[Check, tuple[str, ...]]] = []
    for check, names in picked:
        if check.shares is not None and check.shares in chosen and check.shares_in(run):
            guests.setdefault(check.shares, []).append((check.shares, check, names))
        else:
            alone.append((check, names))
    return [
        ChainPlan(check, names, tuple(g for host in names for g in guests.get(host, [])))
        for check, names in alone
    ]


def chains(
    run: GateRun, chosen: tuple[str, ...], registry: Sequence[Check] = REGISTRY
) -> list[Chain]:
    """The chains :func:`plan` composes, each ready to run."""
    return [functools.partial(_run_chain, run, chain) for chain in plan(run, chosen, registry)]


def _run_chain(run: GateRun, chain: ChainPlan) -> list[CheckResult]:
    shared = tuple(name for _, _, names in chain.guests for name in names)
    results = chain.check.run(replace(run, guests=shared), chain.names)
    by_name = {result.name: result for result in results}
    for host, guest, names in chain.guests:
        results += guest.judge_shared(run, names, by_name[host])
    return results


def compare_rows() -> tuple[CompareRow, ...]:
    """Every check's rows in ``xla-wheels compare``, in the registry's order."""
    return tuple(row for check in REGISTRY for row in check.compare_rows)
