"""Promotion under a lane's launch profile: a receipt counts only if it was judged under
the lane's profile with the digest wheels.lock records now, and the regression rules
compare receipts of the same profile."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from xla_host import receipts
from xla_wheels.release import compare, lanes, policy

MIB = 1024**2
DIGEST = "a" * 64


def receipt(profile: dict[str, Any] | None, host_mib: int = 1000) -> receipts.Receipt:
    memory = {"host_peak_rss_bytes": host_mib * MIB, "device_peak_bytes": "not reported: CPU"}
    check = receipts.CheckEvidence("restart", True, (), {"warm_ready_s": 0.2, "memory": memory})
    return receipts.Receipt(
        kind="gate", bundle="b", created="2025-01-01T00:00:00Z", host="h", device="CPU",
        chip=None, workload="small", versions={}, wheels_match_lock=True, wheels=(),
        problems=(), checks=(check,), profile=profile,
    )  # fmt: skip


def stored(made: receipts.Receipt) -> receipts.StoredReceipt:
    return receipts.StoredReceipt(
        Path("new.json"), made, receipts.canonical_digest(made.payload()), True
    )


TRAIN = {"name": "train", "sha256": DIGEST}
RULE = lanes.Policy(profile="train")


def failures(made: receipts.Receipt, locked_digest: str | None = DIGEST) -> list[tuple[str, str]]:
    verdict = policy.judge_promotion("b", set(), [stored(made)], RULE, None, locked_digest)
    return [(f.rule, f.detail) for f in verdict.failures]


def test_a_receipt_under_the_lanes_profile_with_the_locked_digest_promotes() -> None:
    assert failures(receipt(TRAIN)) == []


def test_promotion_is_refused_when_the_profile_changed_since_the_receipt() -> None:
    assert failures(receipt(TRAIN), locked_digest="b" * 64) == [
        ("profile", "launch profile train changed since new.json was judged (sha256 "
         "aaaaaaaaaaaa then, bbbbbbbbbbbb in wheels.lock now): a changed profile needs a new "
         "gate run"),
    ]  # fmt: skip


def test_promotion_is_refused_for_another_profile_or_none() -> None:
    assert failures(receipt({"name": "eval", "sha256": DIGEST})) == [
        ("profile", "new.json was judged under launch profile eval; the lane requires profile "
         "train"),
    ]  # fmt: skip
    assert failures(receipt(None))[0][1].startswith("new.json was judged under no launch profile")


def test_a_profile_the_lock_does_not_record_is_named() -> None:
    assert failures(receipt(TRAIN), locked_digest=None) == [
        ("profile", "wheels.lock records no launch profile train for bundle b"),
    ]


def test_the_memory_rule_keys_by_profile_as_well_as_workload() -> None:
    rule = lanes.Policy(max_memory_regression=0.10)
    other = receipt({"name": "eval", "sha256": DIGEST}, host_mib=500)
    verdict = policy.judge_promotion("b", set(), [stored(other)], rule, receipt(TRAIN))
    assert [f.rule for f in verdict.failures] == ["memory"]
    assert "not comparable" in verdict.failures[0].detail
    assert "profile eval vs train" in verdict.failures[0].detail


def test_the_regression_rules_compare_receipts_under_the_same_launch_environment() -> None:
    rule = lanes.Policy(max_memory_regression=0.10)
    plain = {"PJRT_DEVICE": "CPU", "TPU_WORKER_ID": "0"}
    flagged = {**plain, "XLA_FLAGS": "--xla_cpu_use_thunk_runtime=false"}
    current = dataclasses.replace(receipt(None), launch_environment=plain)
    other = dataclasses.replace(receipt(None, host_mib=500), launch_environment=flagged)
    verdict = policy.judge_promotion("b", set(), [stored(other)], rule, current)
    assert [f.rule for f in verdict.failures] == ["memory"]
    assert "launch environment XLA_FLAGS '--xla_cpu_use_thunk_runtime=false' vs '(unset)'" in (
        verdict.failures[0].detail
    )
    # Which worker ran is not how it ran; a receipt from before environments were
    # recorded is compared as before.
    worker_1 = dataclasses.replace(other, launch_environment={**plain, "TPU_WORKER_ID": "1"})
    old = dataclasses.replace(other, launch_environment=None)
    for like in (worker_1, old):
        assert policy.judge_promotion("b", set(), [stored(like)], rule, current).passed


def test_a_receipt_keeps_its_profile_through_the_file(tmp_path: Path) -> None:
    made = receipt(TRAIN)
    path = receipts.write_receipt(tmp_path / "r.json", made)
    back = receipts.read_receipt(path)
    assert back.digest_ok and back.receipt.profile_sha256 == DIGEST
    # A receipt written before profiles existed reads as before: no profile, seal intact.
    old = receipts.write_receipt(tmp_path / "old.json", dataclasses.replace(made, profile=None))
    assert "profile" not in old.read_text()
    assert receipts.read_receipt(old).digest_ok


WHEEL = receipts.WheelMatch(
    name="torch_xla-2.9.0-cp311-cp311-linux_x86_64.whl", sha256=DIGEST, project="torch_xla",
    version="2.9.0", matched=True, files=3, problems=(),
)  # fmt: skip


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: d["wheels"][0].pop("sha256"), id="wheel-without-sha256"),
        pytest.param(lambda d: d["wheels"].__setitem__(0, "a string"), id="wheel-not-a-table"),
        pytest.param(lambda d: d["wheels"][0].__setitem__("files", "3"), id="files-a-string"),
        pytest.param(lambda d: d["checks"][0].pop("name"), id="check-without-name"),
    ],
)
def test_a_hand_edited_receipt_entry_is_a_named_error_not_a_traceback(
    tmp_path: Path, damage: Any
) -> None:
    path = receipts.write_receipt(
        tmp_path / "r.json", dataclasses.replace(receipt(None), wheels=(WHEEL,))
    )
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(data))
    with pytest.raises(receipts.ReceiptError, match=r"r\.json: (key|an entry)"):
        receipts.read_receipt(path)


def test_the_lanes_file_names_the_profile_and_the_shipped_preferred_lane_requires_train(
    tmp_path: Path,
) -> None:
    (tmp_path / "build").mkdir()
    config = tmp_path / "build" / "lanes.toml"
    head = (
        'publish-lane = "v"\n\n[lanes.v]\npath = "v"\n\n[lanes.p]\npath = "p"\n[lanes.p.policy]\n'
    )
    config.write_text(head + "profile = 3\n")
    with pytest.raises(lanes.LaneError, match="policy.profile': expected str, got int"):
        lanes.load_config(tmp_path)
    config.write_text(head + 'profile = ""\n')
    with pytest.raises(lanes.LaneError, match="policy.profile': must be a launch profile name"):
        lanes.load_config(tmp_path)
    shipped = lanes.load_config(Path(__file__).resolve().parents[1]).lanes["preferred"].policy
    assert shipped.profile == "train"


def test_compare_shows_profile_differences_next_to_the_figures() -> None:
    a = receipt({**TRAIN, "environment": {"PJRT_DEVICE": "TPU", "XLA_FLAGS": "--xla_a=1"}})
    b = receipt(
        {"name": "train", "sha256": "b" * 64, "environment": {"PJRT_DEVICE": "TPU"}},
        host_mib=1200,
    )
    comparison = compare.compare(stored(a), stored(b))
    labels = [label for label, _, _ in comparison.rows]
    at = labels.index("launch profile")
    assert labels[at - 1] == "workload" and labels[at + 1] == "  XLA_FLAGS"
    assert comparison.rows[at + 1][1:] == ("--xla_a=1", "-")
    assert "peak host memory" in labels
    assert comparison.unlike == (
        "different launch profile: train sha256:aaaaaaaaaaaa vs train sha256:bbbbbbbbbbbb "
        "(XLA_FLAGS)",
    )
    assert "launch profile" in compare.render(comparison)


def test_a_receipt_records_the_runtime_environment_and_never_a_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from xla_host.gate.children import launch_environment

    token = "tok-" + "9" * 12
    for name, value in {
        "XLA_FLAGS": "--xla_cpu_use_thunk_runtime=false",
        "LIBTPU_INIT_ARGS": "--xla_tpu_enable_latency_hiding_scheduler=true",
        "TPU_NAME": "tpu-0",
        "PJRT_SOMETHING": "on",
        "TPU_AUTH_TOKEN": token,
        # The pipeline's own settings: read by the gate, not by the runtime.
        "XLA_WHEELS_NET_TIMEOUT": "120",
        "XLA_WHEELS_RECEIPTS_USERNAME": "uploader",
        "XLA_WHEELS_RECEIPTS_PASSWORD": token,
    }.items():
        monkeypatch.setenv(name, value)
    recorded = launch_environment("TPU")
    assert recorded["XLA_FLAGS"] == "--xla_cpu_use_thunk_runtime=false"
    assert recorded["LIBTPU_INIT_ARGS"].startswith("--xla_tpu_enable_latency")
    assert recorded["TPU_NAME"] == "tpu-0" and recorded["PJRT_SOMETHING"] == "on"
    assert recorded["PJRT_DEVICE"] == "TPU" and recorded["XLA_NO_SPECIAL_SCALARS"] == "1"
    # Masked with a digest (redact.mask_environment), so two tokens' receipts still differ.
    assert recorded["TPU_AUTH_TOKEN"].startswith("<redacted sha256:") and token not in str(recorded)
    assert not [name for name in recorded if name.startswith("XLA_WHEELS_")]
    assert token not in repr(recorded)
