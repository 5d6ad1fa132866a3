"""Promotion and compare by slice topology: receipts of different topologies are never
compared, a lane can require passing receipts for several topologies, and the receipt's
slice record is an additive key that seals and reads back."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from xla_host import receipts
from xla_host.errors import PipelineError
from xla_host.gate import slice as slices
from xla_wheels.release import compare, lanes, policy, promote
from xla_wheels.release.lane_index import IndexLane


def receipt(topology: str | None, warm_s: float = 0.2, passed: bool = True) -> receipts.Receipt:
    check = receipts.CheckEvidence("restart", passed, (), {"warm_ready_s": warm_s})
    record = None
    if topology is not None:
        accelerator = topology if topology.startswith("v") else None
        record = {"accelerator-type": accelerator, "hosts": 4, "chips-per-host": 4,
                  "topology": topology, "workers": []}  # fmt: skip
    return receipts.Receipt(
        kind="gate", bundle="b", created="2025-01-01T00:00:00Z", host="h", device="TPU",
        chip="v6", workload="small", versions={}, wheels_match_lock=True, wheels=(),
        problems=(), checks=(check,), slice=record,
    )  # fmt: skip


def stored(made: receipts.Receipt, name: str = "new.json") -> receipts.StoredReceipt:
    return receipts.StoredReceipt(Path(name), made, receipts.canonical_digest(made.payload()), True)


BOTH = lanes.Policy(checks=("restart",), topologies=("v6e-8", "v6e-32"))


def test_a_lane_needs_a_passing_receipt_for_every_topology_it_names() -> None:
    one = policy.judge_promotion("b", set(), [stored(receipt("v6e-8"))], BOTH, None)
    assert not one.passed
    assert [(f.rule, f.detail) for f in one.failures] == [
        ("topology", "no passing receipt for topology v6e-32 (receipts' topologies: v6e-8)")
    ]
    failing_32 = stored(receipt("v6e-32", passed=False), "b.json")
    assert not policy.judge_promotion(
        "b", set(), [stored(receipt("v6e-8")), failing_32], BOTH, None
    ).passed
    both = [stored(receipt("v6e-8"), "a.json"), stored(receipt("v6e-32"), "b.json")]
    verdict = policy.judge_promotion("b", set(), both, BOTH, None)
    assert verdict.passed and verdict.chosen is both[-1]


def test_a_receipt_of_an_unlisted_or_unrecorded_topology_does_not_count() -> None:
    for made, said in ((receipt("v6e-16"), "topology v6e-16"), (receipt(None), "no recorded")):
        verdict = policy.judge_receipt(stored(made), "b", set(), BOTH, None)
        assert [f.rule for f in verdict.failures] == ["topology"]
        assert said in verdict.failures[0].detail


def test_regressions_compare_receipts_of_the_same_topology_only() -> None:
    # No topologies rule: another topology is not comparable (as another chip is not).
    rule = lanes.Policy(max_warm_regression=0.1)
    verdict = policy.judge_receipt(stored(receipt("v6e-32")), "b", set(), rule, receipt("v6e-8"))
    assert [f.rule for f in verdict.failures] == ["regression"]
    assert "topology v6e-32 vs v6e-8" in verdict.failures[0].detail
    # Under a topologies rule, the current receipt (one per lane) judges its own topology.
    several = dataclasses.replace(BOTH, max_warm_regression=0.1)
    slow_8 = stored(receipt("v6e-8", warm_s=1.0))
    assert [f.rule for f in policy.judge_receipt(
        slow_8, "b", set(), several, receipt("v6e-8")).failures] == ["regression"]  # fmt: skip
    slow_32 = stored(receipt("v6e-32", warm_s=1.0))
    assert policy.judge_receipt(slow_32, "b", set(), several, receipt("v6e-8")).passed


def test_compare_says_receipts_of_two_topologies_are_not_alike() -> None:
    result = compare.compare(stored(receipt("v6e-8")), stored(receipt("v6e-32")))
    assert "different topology: v6e-8 vs v6e-32" in result.unlike
    assert ("topology", "v6e-8", "v6e-32") in result.rows
    alike = compare.compare(stored(receipt("v6e-8")), stored(receipt("v6e-8")))
    assert not [u for u in alike.unlike if "topology" in u]


def test_the_slice_record_is_sealed_and_read_back(tmp_path: Path) -> None:
    spec = slices.SliceSpec(0, 2, None, "v6e-8")
    arrivals = {
        w: slices.Arrival(w, f"h{w}", 1, True, "", {"addressable_devices": ["TPU:0"]})
        for w in (0, 1)
    }
    made = dataclasses.replace(receipt(None), slice=slices.merge_slice(spec, "TPU", arrivals))
    path = receipts.write_receipt(tmp_path / "r.json", made)
    back = receipts.read_receipt(path)
    assert back.digest_ok and back.receipt.topology == "v6e-8"
    assert [w["host"] for w in back.receipt.slice["workers"]] == ["h0", "h1"]  # type: ignore[index]
    # A one-host receipt has no slice key: it reads and seals as before.
    plain = receipts.write_receipt(tmp_path / "p.json", receipt(None))
    assert '"slice"' not in plain.read_text()
    assert receipts.read_receipt(plain).receipt.topology is None


def test_lanes_toml_topologies_must_look_like_topologies(tmp_path: Path) -> None:
    path = tmp_path / lanes.LANES_CONFIG
    path.parent.mkdir(parents=True)
    path.write_text(
        'publish-lane = "v"\n[lanes.v]\npath = "v"\n'
        '[lanes.v.policy]\ntopologies = ["v6e-8", "v6e 32"]\n'
    )
    with pytest.raises(PipelineError, match="'v6e 32' is not a slice topology"):
        lanes.load_config(tmp_path)
    path.write_text(path.read_text().replace('"v6e 32"', '"v6e-32"'))
    assert lanes.load_config(tmp_path).lanes["v"].policy.topologies == ("v6e-8", "v6e-32")


def test_a_refusal_says_which_topologies_the_lane_wants_receipts_from() -> None:
    lane = lanes.Lane("preferred", IndexLane("preferred", "https://i/simple/"), "validation", BOTH)
    verdict = policy.judge_promotion("b", set(), [stored(receipt("v6e-8"))], BOTH, None)
    refused = promote.refusal("b", lane, verdict)
    assert "topology: no passing receipt for topology v6e-32" in refused.message
    assert "each slice topology v6e-8, v6e-32" in str(refused.fix)
