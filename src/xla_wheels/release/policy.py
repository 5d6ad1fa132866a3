"""Whether a lane's policy holds for a bundle: data in, verdict out, no I/O.

A receipt counts only if its seal holds, it names this bundle, its environment was the
lock's wheels (``wheels-match-lock``) and its wheel hashes are exactly the lock's. Then
the lane's rules: device (a CPU receipt never satisfies a TPU rule), every required check
passed, and two regression gates against the lane's current bundle's receipt on the same
workload: warm restart time (``max-warm-regression``) and peak memory
(``max-memory-regression``: the host peak of the restart check's runs, and each device's
peak where both receipts report one; gate.recalibration says how they are measured).
With a ``profile`` rule the receipt must have been judged under that launch profile of
the bundle with the digest wheels.lock records for it now: a changed profile means new
evidence. Both regression gates compare receipts of the same profile too, and of the
same workload: its name and, where both receipts record it, its source digest
(``receipts.workload_difference``), and of the same launch environment where both record
it (``receipts.environment_difference``: XLA_FLAGS, LIBTPU_INIT_ARGS and the other
switches the children started with). With a ``workload`` rule the receipt must have run
that workload (by the name receipts record: ``small``, ``model.py:build``, ...).
A lane that requires signed receipts (``receipt-keys``) counts only a receipt whose DSSE
signature one of its keys verifies: the caller verifies (``release.receipt_trust``) and
passes each receipt's problem in, so the verdict stays free of I/O.

Topology: a receipt from worker 0 of a slice records its topology (``v6e-32``; none for a
one-host run that named no slice); receipts of different topologies are never compared.
With ``topologies = ["v6e-8", "v6e-32"]`` each of them needs a receipt that passes every
rule, a receipt of a topology not listed does not count, and the regression gates compare
only the receipts of the current receipt's topology (lanes.lock keeps one current receipt
per lane, so a topology it was not judged on has nothing like for like to compare with).

Cache packs: with ``require-packs = ["small:v6e-8"]`` (workload:topology) the bundle needs
a cache pack of that workload and topology in the lane it is promoted from (or the lane
itself): the caller passes the lanes' pack index rows in (``xla_host.lane_packs``), failure
rule ``pack`` names each missing one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xla_host import receipt_verdict
from xla_host.lane_packs import PackRow
from xla_host.receipts import (
    Receipt,
    StoredReceipt,
    environment_difference,
    workload_difference,
)
from xla_wheels.release.lanes import Policy


@dataclass(frozen=True)
class RuleFailure:
    rule: str
    """``receipt``, ``seal``, ``signature``, ``wheels``, ``document``, ``device``, ``profile``,
    ``workload``, ``topology``, ``pack``,
    ``check:<name>``, ``regression`` or ``memory``."""
    detail: str


@dataclass(frozen=True)
class ReceiptVerdict:
    receipt: StoredReceipt
    failures: tuple[RuleFailure, ...]

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class PromotionVerdict:
    passed: bool
    chosen: StoredReceipt | None
    """The newest receipt that satisfies every rule."""
    verdicts: tuple[ReceiptVerdict, ...]
    failures: tuple[RuleFailure, ...]
    """Without any usable receipt: why (the newest receipt's failures, or "no receipt")."""


def warm_ready(receipt: Receipt) -> float | None:
    value = receipt.figure("restart", "warm_ready_s")
    return float(value) if isinstance(value, int | float) else None


def judge_receipt(
    stored: StoredReceipt,
    bundle: str,
    locked: set[tuple[str, str]],
    policy: Policy,
    current: Receipt | None,
    profile_sha256: str | None = None,
    documents: frozenset[str] | None = None,
    signature_problem: str | None = None,
) -> ReceiptVerdict:
    """``profile_sha256``: the digest wheels.lock records for the policy's profile;
    ``documents``: the digests of the bundle documents this checkout publishes for the
    bundle (None: not checked); ``signature_problem``: why the receipt's signature is not
    one the lane accepts (None: it is, or the lane requires none)."""
    receipt, name = stored.receipt, stored.path.name
    fails: list[RuleFailure] = []

    def fail(rule: str, detail: str) -> None:
        fails.append(RuleFailure(rule, detail))

    # What the receipt proves on its own (receipt_verdict, shared with status, compare and
    # cache-pack): its seal, its kind, and that it judged this bundle's locked wheels. The
    # checks it failed count here only when the lane requires them (below).
    for reason in receipt_verdict.judge_stored(stored, bundle=bundle, locked=locked).reasons:
        if not reason.rule.startswith("check:") and reason.rule != "receipt":
            fail(reason.rule, reason.said(name))
    if policy.receipt_keys and signature_problem is not None:
        fail("signature", signature_problem)
    if documents is not None and receipt.bundle_document not in (None, *documents):
        # Made on a host against a document this checkout would not publish now (another
        # lock, manifest, policy or host wheel, or not ours): its evidence was judged
        # elsewhere, or by other host code than the lane would serve.
        fail(
            "document",
            f"{name} was judged against bundle document {receipt.bundle_document}, which "
            "no lane of this checkout publishes for the bundle (another wheels.lock, "
            "manifest, lane policy or host wheel in dist/host/)",
        )
    if receipt.kind != "gate":
        fail("receipt", f"{name} is a {receipt.kind} receipt; promotion needs the gate's verdicts")
    if policy.device is not None and receipt.device != policy.device:
        fail("device", f"{name} was judged on {receipt.device}; the lane requires {policy.device}")
    fails.extend(_profile_rule(stored, policy.profile, profile_sha256))
    if policy.workload is not None and receipt.workload != policy.workload:
        fail(
            "workload",
            f"{name} ran workload {receipt.workload}; the lane requires workload "
            f"{policy.workload}",
        )
    fails.extend(_topology_rule(stored, policy.topologies))
    current = _current_of_same_topology(receipt, policy.topologies, current)
    for check_name in policy.checks:
        check = receipt.check(check_name)
        if check is None:
            fail(f"check:{check_name}", f"{name} has no {check_name} check")
        elif check.passed is not True:
            why = "; ".join(check.reasons[:2])
            fail(f"check:{check_name}", f"{name}: {check_name} failed ({why})")
    if policy.max_warm_regression is not None and current is not None:
        fails.extend(_regression(stored, current, policy.max_warm_regression))
    if policy.max_memory_regression is not None and current is not None:
        fails.extend(_memory_regression(stored, current, policy.max_memory_regression))
    return ReceiptVerdict(stored, tuple(fails))


def _profile_rule(
    stored: StoredReceipt, required: str | None, locked_sha256: str | None
) -> list[RuleFailure]:
    if required is None:
        return []
    receipt, name = stored.receipt, stored.path.name
    if receipt.profile_name != required:
        under = receipt.profile_name and f"launch profile {receipt.profile_name}"
        detail = f"{name} was judged under {under or 'no launch profile'}; the lane requires "
        detail += f"profile {required}"
    elif locked_sha256 is None:
        detail = f"wheels.lock records no launch profile {required} for bundle {receipt.bundle}"
    elif receipt.profile_sha256 != locked_sha256:
        detail = (
            f"launch profile {required} changed since {name} was judged (sha256 "
            f"{str(receipt.profile_sha256)[:12]} then, {locked_sha256[:12]} in wheels.lock "
            "now): a changed profile needs a new gate run"
        )
    else:
        return []
    return [RuleFailure("profile", detail)]


def _topology_rule(stored: StoredReceipt, required: Sequence[str]) -> list[RuleFailure]:
    """With a ``topologies`` rule, a receipt counts only for one of them."""
    topology = stored.receipt.topology
    if not required or topology in required:
        return []
    judged = f"topology {topology}" if topology else "no recorded topology (one host, no slice)"
    detail = f"{stored.path.name} was judged on {judged}; the lane requires {', '.join(required)}"
    return [RuleFailure("topology", detail)]


def _current_of_same_topology(
    receipt: Receipt, required: Sequence[str], current: Receipt | None
) -> Receipt | None:
    """The current receipt to compare with: under a ``topologies`` rule only one of the
    same topology (the others have none to compare with; see the module doc)."""
    if current is None or not required or current.topology == receipt.topology:
        return current
    return None


def missing_topologies(
    verdicts: Sequence[ReceiptVerdict], required: Sequence[str]
) -> list[RuleFailure]:
    """Each required topology without a receipt that passes every rule."""
    passing = {v.receipt.receipt.topology for v in verdicts if v.passed}
    judged = sorted({str(v.receipt.receipt.topology) for v in verdicts})
    return [
        RuleFailure(
            "topology",
            f"no passing receipt for topology {topology} (receipts' topologies: "
            f"{', '.join(judged) or 'none'})",
        )
        for topology in required
        if topology not in passing
    ]


def _unlike(rule: str, stored: StoredReceipt, current: Receipt) -> list[RuleFailure]:
    """A failure of ``rule`` when two receipts' figures do not measure the same thing."""
    receipt = stored.receipt
    # Figures measured under another launch profile (other flags, another cache policy)
    # are not comparable either: the profile is part of the key, by name.
    unlike = [
        f"{what} {mine} vs {theirs}"
        for what, mine, theirs in (
            ("device", receipt.device, current.device),
            ("chip", receipt.chip, current.chip),
            ("topology", receipt.topology or "none", current.topology or "none"),
        )
        if mine != theirs
    ]
    # Another workload's graph is another restart: by name, and by source where recorded.
    if (workload := workload_difference(receipt, current)) is not None:
        unlike.append(f"workload {workload}")
    if (profile := receipt.profile_name or "none") != (current.profile_name or "none"):
        unlike.append(f"profile {profile} vs {current.profile_name or 'none'}")
    # Figures measured under other flags or switches (XLA_FLAGS, LIBTPU_INIT_ARGS, ...)
    # measure another program, as another profile does.
    if (environment := environment_difference(receipt, current)) is not None:
        unlike.append(f"launch environment {environment}")
    if not unlike:
        return []
    detail = f"{stored.path.name} is not comparable with the lane's current receipt"
    return [RuleFailure(rule, f"{detail} ({', '.join(unlike)})")]


def peak_memory(receipt: Receipt) -> dict[str, int]:
    """Peak bytes of the restart workload: ``host``, and ``device <name>`` where reported."""
    memory = receipt.figure("restart", "memory")
    if not isinstance(memory, dict):
        return {}
    peaks: dict[str, int] = {}
    if isinstance(memory.get("host_peak_rss_bytes"), int):
        peaks["host"] = memory["host_peak_rss_bytes"]
    devices = memory.get("device_peak_bytes")
    if isinstance(devices, dict):
        peaks.update({f"device {name}": int(value) for name, value in devices.items()})
    return peaks


def _memory_regression(
    stored: StoredReceipt, current: Receipt, tolerance: float
) -> list[RuleFailure]:
    if unlike := _unlike("memory", stored, current):
        return unlike
    mine, theirs = peak_memory(stored.receipt), peak_memory(current)
    if "host" not in mine or "host" not in theirs:
        where = "this receipt" if "host" not in mine else "the current receipt"
        why = "receipts from before the gate recorded memory"
        return [RuleFailure("memory", f"peak host memory missing from {where} ({why})")]
    failures = []
    # A device only one side reports (CPU vs TPU is refused above) has nothing to compare.
    for what in sorted(mine.keys() & theirs.keys()):
        limit = theirs[what] * (1 + tolerance)
        if mine[what] > limit:
            failures.append(
                RuleFailure(
                    "memory",
                    f"peak {what} memory {_mib(mine[what])} is above the current bundle's "
                    f"{_mib(theirs[what])} beyond {tolerance:.0%} (limit {_mib(limit)})",
                )
            )
    return failures


def _mib(value: float) -> str:
    return f"{value / 1024**2:.1f} MiB"


def _regression(stored: StoredReceipt, current: Receipt, tolerance: float) -> list[RuleFailure]:
    if unlike := _unlike("regression", stored, current):
        return unlike
    mine, theirs = warm_ready(stored.receipt), warm_ready(current)
    if mine is None or theirs is None:
        where = "this receipt" if mine is None else "the current receipt"
        return [RuleFailure("regression", f"warm time-to-ready missing from {where}")]
    limit = theirs * (1 + tolerance)
    if mine <= limit:
        return []
    return [
        RuleFailure(
            "regression",
            f"warm restart {mine:.3f}s is slower than the current "
            f"bundle's {theirs:.3f}s beyond {tolerance:.0%} (limit {limit:.3f}s)",
        )
    ]


def judge_promotion(
    bundle: str,
    locked: set[tuple[str, str]],
    receipts: Sequence[StoredReceipt],
    policy: Policy,
    current: Receipt | None,
    profile_sha256: str | None = None,
    documents: frozenset[str] | None = None,
    signatures: Sequence[str | None] | None = None,
    packs: Sequence[PackRow] = (),
) -> PromotionVerdict:
    """Every receipt judged; the newest one that passes is chosen. ``signatures``: per
    receipt (same order) why its signature is not accepted, None where it is; ``packs``:
    the cache packs of the lanes the bundle comes from (``require-packs``)."""
    if policy.empty:
        return PromotionVerdict(True, None, (), ())
    verdict = _judge_receipts(bundle, locked, receipts, policy, current, profile_sha256,
                              documents, signatures)  # fmt: skip
    absent = missing_packs(bundle, policy.packs, packs)
    if absent:
        return PromotionVerdict(False, None, verdict.verdicts, (*verdict.failures, *absent))
    return verdict


def missing_packs(
    bundle: str, required: Sequence[tuple[str, str]], packs: Sequence[PackRow]
) -> list[RuleFailure]:
    """One ``pack`` failure per required (workload, topology) with no pack of the bundle."""
    have = {(row.workload, row.topology) for row in packs if row.bundle == bundle}
    return [
        RuleFailure(
            "pack",
            f"no cache pack of bundle {bundle} for workload {workload} on topology {topology} "
            f"(the lane has: {', '.join(sorted(f'{w}:{t}' for w, t in have)) or 'none'})",
        )
        for workload, topology in required
        if (workload, topology) not in have
    ]


def _judge_receipts(
    bundle: str,
    locked: set[tuple[str, str]],
    receipts: Sequence[StoredReceipt],
    policy: Policy,
    current: Receipt | None,
    profile_sha256: str | None,
    documents: frozenset[str] | None,
    signatures: Sequence[str | None] | None,
) -> PromotionVerdict:
    problems = list(signatures) if signatures is not None else [None] * len(receipts)
    verdicts = tuple(
        judge_receipt(r, bundle, locked, policy, current, profile_sha256, documents, problem)
        for r, problem in zip(receipts, problems, strict=True)
    )
    passing = [v for v in verdicts if v.passed]
    if policy.topologies and (missing := missing_topologies(verdicts, policy.topologies)):
        return PromotionVerdict(False, None, verdicts, tuple(missing))
    if passing:
        return PromotionVerdict(True, passing[-1].receipt, verdicts, ())
    if not verdicts:
        failure = RuleFailure(
            "receipt", f"no receipt for bundle {bundle} in receipts/{bundle}/ or a lane's store"
        )
        return PromotionVerdict(False, None, (), (failure,))
    return PromotionVerdict(False, None, verdicts, verdicts[-1].failures)
