"""rebuild-check on the synthetic upstream (BUILD_MODE=host): the bundle is rebuilt from
nothing into a fresh stage and compared byte for byte with wheels.lock. A reproducible
build passes; the synthetic recipe's non-deterministic hook (random bytes in a member, a
compiler's variation in miniature) fails with diffoscope's report naming that member."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.clirunner import CliResult, run_cli
from tests.missing_tools import skipif_missing
from tests.synthetic_upstream import Synthetic, cli_args
from xla_host.filemode import file_sha256
from xla_wheels import rebuild_check as rebuild

HOST = ("--mode", "host", "--host-python", sys.executable)
NOISY = {"SYNTHETIC_NONDETERMINISTIC_BUILD": "1"}
EPOCH = "1700000000"


def run(syn: Synthetic, command: str, **env: str) -> CliResult:
    args = cli_args(syn, *HOST)
    args[0] = command
    return run_cli(
        *args, env={"HOME": str(syn.root.parent), "SOURCE_DATE_EPOCH": EPOCH, **env},
        timeout=900,
    )  # fmt: skip


def stage_entries(syn: Synthetic) -> list[str]:
    return sorted(p.name for p in (syn.cache / "stages").iterdir())


@pytest.mark.slow
def test_a_reproducible_build_rebuilds_byte_identical(syn: Synthetic) -> None:
    assert run(syn, "wheels").exit_code == 0
    wheels = sorted((syn.root / "dist" / "syn").glob("*.whl"))
    before = {w.name: file_sha256(w) for w in wheels}
    stages = stage_entries(syn)
    lock = (syn.root / "wheels.lock").read_text()

    checked = run(syn, "rebuild-check")
    assert checked.exit_code == 0, checked.output
    for name in before:
        assert f"identical  {name}  sha256:{before[name]}" in checked.stdout
    # Rebuilt from nothing: fresh stages and worktrees under out/syn/rebuild-check, both
    # recipes ran; the recorded build is untouched.
    work = syn.root / "out" / "syn" / "rebuild-check"
    assert sorted(p.name for p in (work / "stages").iterdir()) == ["torch", "torch_xla"]
    for recipe in ("torch", "torch_xla"):
        assert re.search(
            rf"^\s*build: {recipe}\s+[0-9.]+s?\s+ran", checked.stderr, re.M
        ), checked.stderr[-1500:]
    assert stage_entries(syn) == stages
    assert {w.name: file_sha256(w) for w in wheels} == before
    assert (syn.root / "wheels.lock").read_text() == lock


@pytest.mark.slow
def test_a_non_reproducible_recipe_is_named_with_diffoscope_report(syn: Synthetic) -> None:
    assert run(syn, "wheels", **NOISY).exit_code == 0
    checked = run(syn, "rebuild-check", **NOISY)
    assert checked.exit_code == 1, checked.output
    (torch_xla,) = (syn.root / "dist" / "syn").glob("torch_xla-*.whl")
    assert "first difference torch_xla/_compiled.py (content)" in checked.stderr
    assert f"DIFFERS    {torch_xla.name}" in checked.stdout
    assert "identical  torch-" in checked.stdout  # torch's recipe has no such hook
    reports = syn.root / "out" / "syn" / "logs" / "rebuild-check"
    text = (reports / f"{torch_xla.name}.diffoscope.txt").read_text()
    assert "torch_xla/_compiled.py" in text and "RANDOM_BYTES" in text
    report = json.loads((reports / f"{torch_xla.name}.diffoscope.json").read_text())
    assert report["source1"].endswith(torch_xla.name)
    # The RECORD differs too (the member's hash): diffoscope shows it, the name is the member.
    assert "RECORD" in text


def test_first_differing_member_follows_the_recorded_order(tmp_path: Path) -> None:
    import zipfile

    def wheel(path: Path, members: dict[str, bytes]) -> Path:
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in members.items():
                archive.writestr(zipfile.ZipInfo(name, (2023, 1, 1, 0, 0, 0)), data)
        return path

    a = wheel(tmp_path / "a.whl", {"p/a.py": b"1", "p/b.py": b"2", "x.dist-info/RECORD": b""})
    b = wheel(tmp_path / "b.whl", {"p/a.py": b"1", "p/b.py": b"3", "x.dist-info/RECORD": b"r"})
    c = wheel(tmp_path / "c.whl", {"p/a.py": b"1", "p/b.py": b"2", "x.dist-info/RECORD": b""})
    assert rebuild.first_differing_member(a, b) == "p/b.py (content)"
    assert rebuild.first_differing_member(a, c) is None
    d = wheel(tmp_path / "d.whl", {"p/a.py": b"1"})
    assert rebuild.first_differing_member(a, d) == "p/b.py (only in the recorded wheel)"


@skipif_missing("zipinfo: `make supply-tools`" if shutil.which("zipinfo") is None else None)
def test_diffoscope_runs_from_the_pinned_package(tmp_path: Path) -> None:
    import zipfile

    for name, data in (("a.whl", b"one"), ("b.whl", b"two")):
        with zipfile.ZipFile(tmp_path / name, "w") as archive:
            archive.writestr("m.txt", data)
    text = rebuild.run_diffoscope(tmp_path / "a.whl", tmp_path / "b.whl", tmp_path / "r")
    assert "-one" in text.read_text() and "+two" in text.read_text()
