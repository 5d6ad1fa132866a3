"""Promotion and compare judge receipts of the same workload only: its name and its source
digest (``workload-sha256``); a lane's policy can require a workload by name. Receipts
from before the digest was recorded still read, and match a preset by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xla_host import receipts
from xla_host.errors import PipelineError
from xla_wheels.release import compare, lanes, policy

SOURCE = "1" * 64
EDITED = "2" * 64


def receipt(
    workload: str = "model.py:build", sha256: str | None = SOURCE, warm_s: float = 0.2
) -> receipts.Receipt:
    check = receipts.CheckEvidence("restart", True, (), {"warm_ready_s": warm_s})
    return receipts.Receipt(
        kind="gate", bundle="b", created="2025-01-01T00:00:00Z", host="h", device="CPU",
        chip=None, workload=workload, versions={}, wheels_match_lock=True, wheels=(),
        problems=(), checks=(check,), workload_sha256=sha256,
        workload_params={"width": 16} if sha256 else None,
    )  # fmt: skip


def stored(made: receipts.Receipt, name: str = "new.json") -> receipts.StoredReceipt:
    return receipts.StoredReceipt(Path(name), made, receipts.canonical_digest(made.payload()), True)


def failures(
    made: receipts.Receipt, rule: lanes.Policy, current: receipts.Receipt | None = None
) -> list[tuple[str, str]]:
    verdict = policy.judge_promotion("b", set(), [stored(made)], rule, current)
    return [(f.rule, f.detail) for f in verdict.failures]


def test_a_lane_can_require_the_workload_its_promotions_ran() -> None:
    rule = lanes.Policy(workload="model.py:build")
    assert failures(receipt(), rule) == []
    assert failures(receipt("small"), rule) == [
        ("workload", "new.json ran workload small; the lane requires workload model.py:build")
    ]


def test_the_regression_rule_refuses_a_receipt_of_the_workloads_edited_source() -> None:
    rule = lanes.Policy(max_warm_regression=0.10)
    assert failures(receipt(warm_s=0.21), rule, current=receipt()) == []
    [(name, detail)] = failures(receipt(sha256=EDITED, warm_s=0.1), rule, current=receipt())
    assert name == "regression"
    assert "not comparable with the lane's current receipt" in detail
    assert "workload model.py:build from source sha256 222222222222 vs 111111111111" in detail
    assert "(its source changed)" in detail


def test_a_receipt_without_a_digest_is_compared_by_the_presets_name() -> None:
    old_small = receipt("small", sha256=None)
    assert receipts.workload_difference(receipt("small"), old_small) is None
    assert receipts.workload_difference(receipt("medium"), old_small) == "medium vs small"


def test_compare_shows_the_workloads_digest_and_names_another_source() -> None:
    a, b = stored(receipt(), "a.json"), stored(receipt(sha256=EDITED), "b.json")
    compared = compare.compare(a, b)
    rows = {label: (a, b) for label, a, b in compared.rows}
    assert rows["workload"] == (
        "model.py:build (source sha256 111111111111)",
        "model.py:build (source sha256 222222222222)",
    )
    assert compared.unlike == (
        "different workload: model.py:build from source sha256 111111111111 vs 222222222222 "
        "(its source changed)",
    )
    same = compare.compare(stored(receipt(), "a.json"), stored(receipt(), "b.json"))
    assert same.unlike == ()


def test_the_digest_and_params_are_written_read_and_sealed(tmp_path: Path) -> None:
    path = receipts.write_receipt(tmp_path / "r.json", receipt())
    data = json.loads(path.read_text())
    assert data["workload-sha256"] == SOURCE and data["workload-params"] == {"width": 16}
    back = receipts.read_receipt(path)
    assert back.digest_ok and back.receipt == receipt()
    # Edited after it was written: the seal no longer holds.
    data["workload-sha256"] = EDITED
    path.write_text(json.dumps(data))
    assert not receipts.read_receipt(path).digest_ok


def test_a_receipt_from_before_workload_digests_reads_as_it_was(tmp_path: Path) -> None:
    old = receipt("small", sha256=None)
    payload = old.payload()
    # No new key appears in a receipt that has none to give: its seal is the old one.
    assert "workload-sha256" not in payload and "workload-params" not in payload
    path = receipts.write_receipt(tmp_path / "r.json", old)
    back = receipts.read_receipt(path)
    assert back.digest_ok
    assert (back.receipt.workload, back.receipt.workload_sha256) == ("small", None)


def _lanes_file(root: Path, policy_lines: str) -> Path:
    (root / "build").mkdir(parents=True)
    path = root / "build" / "lanes.toml"
    path.write_text(
        'publish-lane = "validation"\n'
        '[lanes.validation]\npath = "dist/lanes/validation"\n'
        '[lanes.preferred]\npath = "dist/lanes/preferred"\npromote-from = "validation"\n'
        f"[lanes.preferred.policy]\n{policy_lines}\n"
    )
    return path


def test_lanes_toml_names_the_required_workload(tmp_path: Path) -> None:
    _lanes_file(tmp_path, 'workload = "model.py:build"\ndevice = "TPU"')
    config = lanes.load_config(tmp_path)
    assert config.lanes["preferred"].policy == lanes.Policy(device="TPU", workload="model.py:build")


def test_an_empty_workload_in_a_policy_is_refused(tmp_path: Path) -> None:
    _lanes_file(tmp_path, 'workload = " "')
    with pytest.raises(PipelineError) as caught:
        lanes.load_config(tmp_path)
    assert "workload" in str(caught.value) and caught.value.exit_code == 2
