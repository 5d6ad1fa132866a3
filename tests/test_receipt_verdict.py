"""One receipt verdict (xla_host.receipt_verdict): what a receipt proves, for which bundle
and wheels, and why not; status, compare, promotion, the gate's last line and cache-pack
all say the same of one receipt."""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path

from xla_host import receipt_verdict, receipts
from xla_host.installed import WheelMatch
from xla_wheels.release import compare, policy, status
from xla_wheels.release.lanes import Policy

TORCH_XLA = WheelMatch("torch_xla-2.9.0-cp313.whl", "a" * 64, "torch_xla", "2.9.0", True, 3)
LOCKED = {(TORCH_XLA.name, TORCH_XLA.sha256)}


def receipt(**changes: object) -> receipts.Receipt:
    made = receipts.Receipt(
        kind="gate", bundle="v6e-2.11", created="2026-01-01T00:00:00Z", host="h",
        device="TPU", chip="v6e", workload="small", versions={}, wheels_match_lock=True,
        wheels=(TORCH_XLA,), problems=(),
        checks=(receipts.CheckEvidence("restart", True, (), {}),
                receipts.CheckEvidence("hbm", True, (), {})),
    )  # fmt: skip
    return dataclasses.replace(made, **changes)  # type: ignore[arg-type]


def stored(
    made: receipts.Receipt, tmp_path: Path, *, sealed: bool = True
) -> receipts.StoredReceipt:
    return receipts.StoredReceipt(tmp_path / "r.json", made, "sha256:x", sealed)


def test_a_sealed_gate_receipt_whose_checks_passed_on_the_locked_wheels_passed() -> None:
    verdict = receipt_verdict.judge(receipt(), bundle="v6e-2.11", locked=LOCKED)
    assert verdict.passed and verdict.reasons == () and verdict.shown == "passed"
    assert verdict.bundle == "v6e-2.11" and verdict.wheels == LOCKED
    assert verdict.gate_label == "passed, for the locked wheels of v6e-2.11"


def test_each_way_a_receipt_falls_short_is_one_reason_in_the_order_a_reader_fixes_them() -> None:
    failed = receipt(checks=(receipts.CheckEvidence("restart", False, ("warm run compiled",), {}),))
    assert receipt_verdict.judge(failed).word == receipt_verdict.FAILED
    assert receipt_verdict.judge(failed).why == "it failed check restart (warm run compiled)"

    stock = receipt(wheels_match_lock=False, problems=("torch_xla 2.7.0 is not the lock's",))
    verdict = receipt_verdict.judge(stock)
    assert verdict.word == receipt_verdict.NOT_LOCKED and verdict.checks_passed
    assert not verdict.passed
    assert verdict.why == (
        "it judged an environment that was not the lock's wheels (torch_xla 2.7.0 is not the "
        "lock's)"
    )
    assert "NOT for the locked wheels" in verdict.gate_label

    other = receipt_verdict.judge(receipt(), bundle="v6e-2.9", locked=LOCKED)
    assert [r.rule for r in other.reasons] == ["wheels"]
    assert other.why == "it is a receipt for bundle v6e-2.11, not v6e-2.9"

    relocked = receipt_verdict.judge(receipt(), locked={("torch_xla-2.9.0-cp313.whl", "b" * 64)})
    assert relocked.why.startswith("it judged torch_xla-2.9.0-cp313.whl aaaaaaaaaaaa; wheels.lock")

    edited = receipt_verdict.judge(receipt(), sealed=False)
    assert edited.word == receipt_verdict.EDITED and edited.reasons[0].rule == "seal"

    bench = receipt_verdict.judge(
        receipt(kind="bench", checks=(receipts.CheckEvidence("bench", None, (), {}),))
    )
    assert bench.word == receipt_verdict.FAILED
    assert [r.rule for r in bench.reasons] == ["receipt"]


def test_status_shows_the_verdict_and_its_reason_in_text_and_json(tmp_path: Path) -> None:
    stock = receipt(wheels_match_lock=False, problems=("torch_xla 2.7.0 is not the lock's",))
    now = datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)
    shown = status.receipt_status(tmp_path, stored(stock, tmp_path), now)
    assert shown.verdict == "not for the locked wheels"
    found = status.Status([status.BundleStatus("v6e-2.11", True, [], [shown])], [])
    text = status.render(found)
    assert "r.json: not for the locked wheels on TPU (v6e)" in text
    assert "why: it judged an environment that was not the lock's wheels" in text
    row = json.loads(json.dumps(found.as_json()))["bundles"][0]["receipts"][0]
    assert row["verdict"] == "not for the locked wheels"
    assert row["reasons"] == [receipt_verdict.judge(stock).why]


def test_promotion_and_compare_give_the_verdicts_reasons_for_the_same_receipt(
    tmp_path: Path,
) -> None:
    stock = stored(receipt(wheels_match_lock=False, problems=("not the lock's",)), tmp_path)
    judged = policy.judge_receipt(stock, "v6e-2.11", LOCKED, Policy(), None)
    assert [(f.rule, f.detail) for f in judged.failures] == [
        ("wheels", "r.json judged an environment that was not the lock's wheels (not the lock's)")
    ]
    side = compare.compare(stock, stored(receipt(), tmp_path))
    assert "A's receipt not for the locked wheels: it judged an environment that was not the " \
        "lock's wheels (not the lock's)" in side.unlike  # fmt: skip
    assert ("verdict", "not for the locked wheels", "passed") in side.rows
