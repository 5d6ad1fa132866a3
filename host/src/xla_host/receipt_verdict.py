"""What a receipt proves, said once: passed or not, for which bundle and wheels, and why not.

Every command that reads a receipt's meaning goes through :func:`judge`: the gate's and a
host's last line (``receipt: … (…)``), ``make status``, ``make compare``, promotion (whose
lane rules come on top: :mod:`xla_wheels.release.policy`) and ``make cache-pack`` (a pack
is published for a bundle only on a receipt that passed for that bundle's wheels). Before
this module each had its own rule, and they disagreed: cache-pack published a pack on a
receipt the gate had called "NOT for the locked wheels", and status called the same one
"failed" with no reason.

A receipt *passed* when its seal holds, the gate judged something (a benchmark judges
nothing), every check it judged passed, and the environment it judged was the locked
wheels of the bundle it names (``wheels-match-lock``; with ``locked``, also exactly those
files). Each way it falls short is one reason, in the order a reader fixes them.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from xla_host.receipts import Receipt, StoredReceipt

#: The verdict's words, as ``make status`` and ``--json`` show them.
PASSED = "passed"
FAILED = "failed"
EDITED = "edited"
#: Every check passed, but on wheels other than the bundle's locked ones (stock torch_xla
#: on a CPU, a wheel built elsewhere): evidence about those wheels, not the bundle's.
NOT_LOCKED = "not for the locked wheels"


@dataclass(frozen=True)
class Reason:
    """One way a receipt falls short: the rule (``seal``, ``receipt``, ``check:<name>``,
    ``wheels``: promotion's rule names) and a phrase naming what to fix."""

    rule: str
    text: str
    """Read after the receipt's name (``foreign.json judged …``): no subject of its own."""

    def said(self, subject: str = "it") -> str:
        return f"{subject} {self.text}"


@dataclass(frozen=True)
class Verdict:
    word: str
    """:data:`PASSED`, :data:`FAILED`, :data:`EDITED` or :data:`NOT_LOCKED`."""
    bundle: str | None
    """The bundle the receipt names (None: judged against no bundle)."""
    wheels: frozenset[tuple[str, str]]
    """The (file name, sha256) pairs it judged."""
    reasons: tuple[Reason, ...]
    """Why it did not pass, in the order a reader fixes them; empty when it passed."""

    @property
    def passed(self) -> bool:
        return self.word == PASSED

    @property
    def checks_passed(self) -> bool:
        """Every check it judged passed, whatever wheels it judged (a CPU lane's packs)."""
        return self.word in (PASSED, NOT_LOCKED)

    @property
    def shown(self) -> str:
        """One line: the word, and the first reasons."""
        return self.word if not self.reasons else f"{self.word}: {self.why}"

    @property
    def why(self) -> str:
        """The first reasons, joined (empty when it passed)."""
        return "; ".join(r.said() for r in self.reasons[:3])

    @property
    def gate_label(self) -> str:
        """What the gate (or a host) prints beside the receipt's path."""
        if self.passed:
            return f"passed, for the locked wheels of {self.bundle}"
        if self.word == NOT_LOCKED:
            return (
                "its checks passed, but NOT for the locked wheels of any bundle: it cannot be "
                "used to promote, nor to publish a cache pack into a lane that requires locked "
                "wheels"
            )
        return f"{self.word}: {self.why}: it cannot be used to promote"


def judge(
    receipt: Receipt,
    *,
    sealed: bool = True,
    bundle: str | None = None,
    locked: Collection[tuple[str, str]] | None = None,
) -> Verdict:
    """The verdict on ``receipt``; ``sealed``: its digest matches its content; ``bundle``:
    the bundle it must be for (None: the one it names); ``locked``: the (name, sha256)
    pairs wheels.lock records for that bundle now (None: not compared)."""
    reasons: list[Reason] = []
    if not sealed:
        text = "does not match its digest (edited after it was written)"
        reasons.append(Reason("seal", text))
    if receipt.kind != "gate":
        text = f"is a {receipt.kind} receipt; only the gate's receipts hold verdicts"
        reasons.append(Reason("receipt", text))
    judged = [c for c in receipt.checks if c.passed is not None]
    if receipt.kind == "gate" and not judged:
        reasons.append(Reason("receipt", "judged no check"))
    for check in judged:
        if check.passed is not True:
            why = "; ".join(check.reasons[:2]) or "no reason recorded"
            reasons.append(Reason(f"check:{check.name}", f"failed check {check.name} ({why})"))
    checks_ok = not reasons
    if bundle is not None and receipt.bundle != bundle:
        text = f"is a receipt for bundle {receipt.bundle}, not {bundle}"
        reasons.append(Reason("wheels", text))
    if not receipt.wheels_match_lock:
        why = "; ".join(receipt.problems[:3]) or "no wheels compared"
        text = f"judged an environment that was not the lock's wheels ({why})"
        reasons.append(Reason("wheels", text))
    if locked is not None and receipt.locked_files != set(locked):
        theirs = ", ".join(f"{n} {s[:12]}" for n, s in sorted(receipt.locked_files)) or "none"
        ours = ", ".join(f"{n} {s[:12]}" for n, s in sorted(locked)) or "none"
        reasons.append(Reason("wheels", f"judged {theirs}; wheels.lock has {ours}"))
    if not sealed:
        word = EDITED
    elif not reasons:
        word = PASSED
    elif checks_ok:
        word = NOT_LOCKED
    else:
        word = FAILED
    return Verdict(word, receipt.bundle, frozenset(receipt.locked_files), tuple(reasons))


def judge_stored(
    stored: StoredReceipt,
    *,
    bundle: str | None = None,
    locked: Collection[tuple[str, str]] | None = None,
) -> Verdict:
    """:func:`judge` of a receipt read from a file or a store (its seal as read)."""
    return judge(stored.receipt, sealed=stored.digest_ok, bundle=bundle, locked=locked)
