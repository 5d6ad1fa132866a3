"""The audit stamp a job writes at its start, read back; `jobs` answers "which jobs ran this
wheel" from a directory of them; `make status` shows each receipt's topology.

Fast: stamps are written by the host side's own writer (``xla_host.stamp``) and read by
the real CLI (``python -m xla_wheels jobs``). The stamps the runtime image's entrypoint
and ``doctor --json --stamp`` write are in tests/test_runtime_image.py and
tests/test_release_history.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path

import pytest

from tests.clirunner import run_cli
from xla_host import receipts
from xla_host.stamp import Stamp, StampedWheel, StampError, read_stamp, write_stamp
from xla_wheels.release import status

TORCH = StampedWheel("torch-2.9.0-py3-none-any.whl", "1" * 64, True)
XLA_A = StampedWheel("torch_xla-2.9.0+pa-py3-none-any.whl", "a" * 64, True)
XLA_B = StampedWheel("torch_xla-2.9.0+pb-py3-none-any.whl", "b" * 64, None)


def stamp(*wheels: StampedWheel, created: str, command: str = "train.py") -> Stamp:
    return Stamp(
        created=created, host="tpu-vm-0", bundle="v6e-2.11", lane="preferred",
        wheels=wheels, receipt_digest="sha256:" + "c" * 64, profile="train",
        profile_sha256="d" * 64, cache_path="/mnt/xla-cache/x", role="writer", verdict="ok",
        job={"command": command},
    )  # fmt: skip


def test_a_stamp_is_written_by_rename_and_reads_back_the_same(tmp_path: Path) -> None:
    made = stamp(TORCH, XLA_A, created="2026-01-02T03:04:05Z")
    path = write_stamp(tmp_path / "jobs" / "job-1.json", made)
    assert read_stamp(path) == made
    assert [p.name for p in path.parent.iterdir()] == ["job-1.json"]  # no temporary left
    document = json.loads(path.read_text())
    assert document["stamp-version"] == "1" and document["receipt-digest"].startswith("sha256:")


def test_a_stamp_that_cannot_be_written_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "not-a-directory").write_text("")
    target = tmp_path / "not-a-directory" / "job.json"
    with pytest.raises(StampError) as refused:
        write_stamp(target, stamp(TORCH, created="2026-01-02T00:00:00Z"))
    assert f"cannot write the stamp {target}" in refused.value.message
    assert refused.value.exit_code == 2 and "XLA_WHEELS_STAMP=" in (refused.value.fix or "")


def test_jobs_names_the_jobs_that_ran_a_wheel_by_name_or_sha256(tmp_path: Path) -> None:
    stamps = tmp_path / "stamps"
    write_stamp(stamps / "a.json", stamp(TORCH, XLA_A, created="2026-01-02T00:00:00Z",
                                         command="train.py --steps 10"))  # fmt: skip
    write_stamp(stamps / "node-1" / "b.json", stamp(TORCH, XLA_B, created="2026-01-01T00:00:00Z"))
    by_name = run_cli("jobs", "--wheel", XLA_A.name, "--stamps", str(stamps))
    assert by_name.exit_code == 0, by_name.output
    assert f"1 job(s) ran {XLA_A.name}:" in by_name.stdout
    assert "`train.py --steps 10`" in by_name.stdout and "a.json" in by_name.stdout
    both = run_cli("jobs", "--wheel", f"sha256:{TORCH.sha256}", "--stamps", str(stamps), "--json")
    assert both.exit_code == 0, both.output
    rows = json.loads(both.stdout)
    assert [Path(r["stamp"]).name for r in rows] == ["b.json", "a.json"]  # oldest first
    none = run_cli("jobs", "--wheel", "e" * 64, "--stamps", str(stamps))
    assert none.exit_code == 0 and "no stamp under" in none.stdout


def test_a_file_that_is_no_stamp_is_refused_naming_it_and_the_field(tmp_path: Path) -> None:
    stamps = tmp_path / "stamps"
    path = write_stamp(stamps / "a.json", stamp(TORCH, created="2026-01-02T00:00:00Z"))
    document = json.loads(path.read_text())
    del document["bundle"]
    path.write_text(json.dumps(document))
    refused = run_cli("jobs", "--wheel", TORCH.name, "--stamps", str(stamps))
    assert refused.exit_code == 2, refused.output
    assert f"{path}: key 'bundle'" in refused.stderr and "fix:" in refused.stderr
    missing = run_cli("jobs", "--wheel", TORCH.name, "--stamps", str(tmp_path / "nowhere"))
    assert missing.exit_code == 2 and "is not a directory of stamps" in missing.stderr


@dataclasses.dataclass(frozen=True)
class ReceiptWithTopology(receipts.Receipt):
    """A receipt as the slice work records it (a field this checkout's Receipt may lack)."""

    topology: str | None = None


def test_status_shows_each_receipts_topology_and_one_host_when_absent(tmp_path: Path) -> None:
    made = receipts.Receipt(
        kind="gate", bundle="b", created="2026-01-01T00:00:00Z", host="h", device="TPU",
        chip="v6e", workload="small", versions={}, wheels_match_lock=True, wheels=(),
        problems=(), checks=(receipts.CheckEvidence("restart", True, (), {}),),
    )  # fmt: skip
    sliced = ReceiptWithTopology(**dataclasses.asdict(made) | {"checks": made.checks,
                                                               "topology": "2x4"})  # fmt: skip
    now = datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)
    shown = []
    for name, receipt in (("old.json", made), ("new.json", sliced)):
        stored = receipts.StoredReceipt(tmp_path / name, receipt, "sha256:x", True)
        shown.append(status.receipt_status(tmp_path, stored, now))
    assert [r.topology for r in shown] == [None, "2x4"]
    text = status.render(status.Status([status.BundleStatus("b", True, [], shown)], []))
    assert "old.json: passed on TPU (v6e), topology one host, workload small" in text
    assert "new.json: passed on TPU (v6e), topology 2x4, workload small" in text
