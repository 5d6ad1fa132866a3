"""One workload identity (xla_host.gate.workload.name_of): every spelling the gate takes
names one workload, the way receipts and packs record it, in every command that takes a
workload: cache-pack, cache fetch, a lane policy's workload and require-packs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.test_cache_pack import keypair, manifest
from xla_host import cache_pack, receipts
from xla_host.gate.workload import WorkloadName, name_of, resolve, same_workload
from xla_host.values import BadValue


def test_every_spelling_of_a_file_names_the_one_workload_the_gate_records(tmp_path: Path) -> None:
    source = tmp_path / "models" / "decoder.py"
    source.parent.mkdir()
    source.write_text("def build(device):\n    ...\n")
    gate_name = resolve(f"{source}:build").name
    spellings = (f"{source}:build", "models/decoder.py:build", "./models/decoder.py:build")
    named = {name_of(text, cwd=tmp_path) for text in spellings}
    assert len(named) == 1
    (one,) = named
    assert one.name == gate_name == "decoder.py:build"
    assert one.sha256 is not None and len(one.sha256) == 64
    # Named on a host that does not have the file: the same name, no digest to compare.
    assert name_of("decoder.py:build", cwd=tmp_path / "elsewhere") == WorkloadName(
        "decoder.py:build", None
    )
    assert name_of("decoder.py", cwd=tmp_path).name == "decoder.py:workload"
    assert name_of("small") == WorkloadName("small", None)
    assert name_of("pkg.model:build") == WorkloadName("pkg.model:build", None)
    for bad in ("decoder.py:not-a-name", "", "pkg.model"):
        with pytest.raises(BadValue):
            name_of(bad)


def test_a_workload_of_another_source_is_named_with_both_digests() -> None:
    wanted = WorkloadName("decoder.py:build", "a" * 64)
    assert same_workload(wanted, "decoder.py:build", "a" * 64) is None
    assert same_workload(wanted, "decoder.py:build", None) is None
    assert same_workload(wanted, "small", None) == "workload small, not decoder.py:build"
    differs = same_workload(wanted, "decoder.py:build", "b" * 64)
    assert differs is not None and "bbbbbbbbbbbb" in differs and "aaaaaaaaaaaa" in differs


@pytest.mark.slow
def test_cache_pack_takes_the_path_the_gate_took_and_lists_what_it_holds_otherwise(
    tmp_path: Path,
) -> None:
    from tests.test_cache_pack_lane import as_cpu_lane
    from tests.test_error_contract import cli, project_copy
    from xla_wheels.release import lanes

    root = project_copy(tmp_path)
    as_cpu_lane(root)
    lanes.write_state(root, "validation", lanes.LaneState("v6e-2.9", (), None, None))
    source = tmp_path / "decoder.py"
    source.write_text("def build(device):\n    ...\n")
    digest_of_source = name_of(str(source)).sha256
    made = receipts.Receipt(
        kind="gate", bundle="v6e-2.9", created="2026-01-01T00:00:00Z", host="h", device="CPU",
        chip=None, workload="decoder.py:build", versions={}, wheels_match_lock=False, wheels=(),
        problems=(), checks=(receipts.CheckEvidence("restart", True, (), {}),),
    )  # fmt: skip
    written = receipts.write_receipt(receipts.receipt_path(root, made), made)
    cache = tmp_path / "cold"
    cache.mkdir()
    (cache / "123456789012").write_bytes(os.urandom(500))
    private, public = keypair(tmp_path, "gate")
    packs = root / "out" / "gate" / "packs"
    workload = {"name": "decoder.py:build", "sha256": digest_of_source, "params": {}}
    cache_pack.write_pack(packs, cache, private, manifest(
        bundle="v6e-2.9", workload=workload,
        receipt_digest=receipts.read_receipt(written).digest))  # fmt: skip
    args = ("cache-pack", "--bundle", "v6e-2.9", "--lane", "validation", "--public-key",
            str(public))  # fmt: skip

    wrong = cli(root, *args, "--workload", "small")
    assert wrong.exit_code == 2, wrong.output
    assert "holds no cache pack of bundle v6e-2.9 and workload small (it holds: " in wrong.stderr
    assert "workload decoder.py:build, not small" in wrong.stderr
    assert "run the gate" not in wrong.stderr  # it ran: the fix names the spelling instead

    done = cli(root, *args, "--workload", f"{source}:build")
    assert done.exit_code == 0, done.output
    assert "decoder.py:build" in done.stdout

    source.write_text("def build(device):\n    return 2\n")  # edited since the gate ran
    changed = cli(root, *args, "--workload", f"{source}:build")
    assert changed.exit_code == 2, changed.output
    assert "the file changed since" in changed.stderr


def test_a_lane_policy_names_a_workload_as_receipts_do(tmp_path: Path) -> None:
    from tests.test_error_contract import project_copy
    from xla_wheels.release import lanes

    root = project_copy(tmp_path)
    config = root / "build" / "lanes.toml"
    text = config.read_text().replace(
        'profile = "train"\n',
        'profile = "train"\nworkload = "/models/decoder.py:build"\n'
        'require-packs = ["./decoder.py:build:v6e-8"]\n',
        1,
    )
    config.write_text(text)
    policy = lanes.load_config(root).lane("preferred").policy
    assert policy.workload == "decoder.py:build"
    assert policy.packs == (("decoder.py:build", "v6e-8"),)
