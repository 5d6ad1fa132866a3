"""Wheel identity, reproducible bytes, no silent replacement, readable files (build stage).

End to end through the CLI on the synthetic upstream (tests/synthetic_upstream.py) in
host mode, with a real pypiserver on loopback where publishing is part of the claim.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.clirunner import CliResult, run_cli
from tests.publish_support import IndexServer, host_venv
from tests.synthetic_upstream import Synthetic, cli_args, make_patch
from xla_host.filemode import file_sha256
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels import wheel_stamp
from xla_wheels.wheels_lock import read_lock

HOST = ("--mode", "host", "--host-python", sys.executable)
GOOD_ENV = {"PJRT_DEVICE": "TPU", "XLA_NO_SPECIAL_SCALARS": "1"}
NOISY = {"SYNTHETIC_NONDETERMINISTIC_BUILD": "1"}


def build(
    syn: Synthetic, bundle: str = "syn", env: dict[str, str] | None = None, umask: int = 0o022
) -> subprocess.CompletedProcess[str]:
    """``python -m xla_wheels wheels`` as a user types it (host mode)."""
    return run_cli(
        *cli_args(syn, *HOST, bundle=bundle),
        env={"HOME": str(syn.root.parent), **(env or {})}, timeout=600, umask=umask,
    )  # fmt: skip


def shas(syn: Synthetic, bundle: str = "syn") -> dict[str, str]:
    return {w.name: file_sha256(w) for w in sorted((syn.root / "dist" / bundle).glob("*.whl"))}


def locked(syn: Synthetic, bundle: str = "syn") -> dict[str, str]:
    entry = read_lock(syn.root / "wheels.lock").entry(bundle)
    return {wheel.name: wheel.sha256 for wheel in entry.wheels or ()}


def wipe_stage_cache(syn: Synthetic) -> None:
    shutil.rmtree(syn.cache / "stages")


@pytest.mark.slow
def test_bundles_sharing_inputs_verify_doctor_and_publish_side_by_side(
    syn: Synthetic,
    tmp_path: Path,
    index_server: IndexServer,
) -> None:
    # Same torch/torch_xla/openxla inputs, another manifest (a libtpu bump in real life).
    text = syn.bundle_path().read_text()
    syn.bundle_path("syn-next").write_text(
        text.replace('name = "syn"', 'name = "syn-next"').replace(
            "synthetic upstream (test data)", "the same inputs, the next libtpu"
        )
    )
    assert (first := build(syn)).exit_code == 0, first.stderr
    second = build(syn, "syn-next")
    assert second.exit_code == 0, second.stderr
    assert "build: torch_xla stage cached" in second.stderr
    assert shas(syn, "syn-next") == shas(syn, "syn")  # one identity: the same bytes

    env = index_server.credentials
    for bundle, action in (("syn", "uploaded"), ("syn-next", "skipped")):
        published = cli(
            syn.root, "publish", "--bundle", bundle, "--index-url", index_server.url, env=env
        )
        assert published.exit_code == 0, published.output
        assert published.stdout.count(action) == 2, published.stdout
    assert sorted(p.name for p in index_server.packages.iterdir()) == sorted(shas(syn))

    for bundle in ("syn", "syn-next"):
        verified = cli(
            syn.root, "verify-install", "--bundle", bundle, "--index-url", index_server.url,
            "--no-deps", "--require-provenance", env=env,
        )  # fmt: skip
        assert verified.exit_code == 0, verified.output
        assert "provenance" in verified.stdout and "matches wheels.lock" in verified.stdout

    wheels = sorted((syn.root / "dist" / "syn").glob("*.whl"))
    python = host_venv(tmp_path, wheels)
    [xla_wheel] = [w.name for w in wheels if w.name.startswith("torch_xla-")]
    xla_version = parse_wheel_name(xla_wheel).version
    for bundle in ("syn", "syn-next"):
        # The runtime contract: a cache directory that names the build it holds executables of.
        cache = tmp_path / f"xla_cache_{bundle}_txla{xla_version}"
        cache.mkdir()
        doctor = cli(
            syn.root, "doctor", "--bundle", bundle, "--python", str(python),
            env={**GOOD_ENV, "XLA_PERSISTENT_CACHE_PATH": str(cache)},
        )  # fmt: skip
        assert doctor.exit_code == 0, doctor.output
        assert "ok   provenance" in doctor.stdout, doctor.stdout


@pytest.mark.slow
def test_rebuild_after_wiping_the_stage_cache_gives_the_same_bytes(syn: Synthetic) -> None:
    assert (first := build(syn)).exit_code == 0, first.stderr
    before = shas(syn)
    stage_wheels = sorted((syn.cache / "stages").glob("*/*.whl"))
    assert {w.name: file_sha256(w) for w in stage_wheels} == before
    wipe_stage_cache(syn)
    # Another umask and a later clock must not matter either.
    again = build(syn, umask=0o002)
    assert again.exit_code == 0, again.stderr
    assert "==> build: torch_xla" in again.stderr  # really rebuilt
    assert {w.name: file_sha256(w) for w in (syn.cache / "stages").glob("*/*.whl")} == before
    assert shas(syn) == before == locked(syn)


@pytest.mark.slow
def test_a_different_rebuild_stops_and_keep_recorded_or_a_build_tag_works(
    syn: Synthetic,
    index_server: IndexServer,
) -> None:
    assert (first := build(syn, env=NOISY)).exit_code == 0, first.stderr
    recorded = shas(syn)
    lock_before = (syn.root / "wheels.lock").read_bytes()
    published = cli(
        syn.root, "publish", "--bundle", "syn", "--index-url", index_server.url,
        env=index_server.credentials,
    )  # fmt: skip
    assert published.exit_code == 0, published.output

    wipe_stage_cache(syn)
    stopped = build(syn, env=NOISY)
    assert stopped.exit_code == 1, stopped.stderr  # RecordedWheelDiffers: FAILED
    (xla_name,) = [name for name in recorded if name.startswith("torch_xla-")]
    rebuilt = file_sha256(next((syn.cache / "stages").glob("torch_xla-*/torch_xla-*.whl")))
    assert rebuilt != recorded[xla_name]
    assert "error:" in stopped.stderr and "Traceback" not in stopped.stderr
    assert recorded[xla_name] in stopped.stderr and rebuilt in stopped.stderr
    assert "KEEP_RECORDED=1" in stopped.stderr and "BUILD_TAG=1" in stopped.stderr
    assert shas(syn) == recorded
    assert (syn.root / "wheels.lock").read_bytes() == lock_before

    kept = build(syn, env={**NOISY, "XLA_WHEELS_KEEP_RECORDED": "1"})
    assert kept.exit_code == 0, kept.stderr
    assert shas(syn) == recorded == locked(syn)
    stage_xla = next((syn.cache / "stages").glob("torch_xla-*/torch_xla-*.whl"))
    assert file_sha256(stage_xla) == recorded[xla_name]  # the stage holds the recorded file

    wipe_stage_cache(syn)
    tagged = build(syn, env={**NOISY, "XLA_WHEELS_BUILD_TAG": "1"})
    assert tagged.exit_code == 0, tagged.stderr
    now = shas(syn)
    assert now == locked(syn)
    tagged_name = xla_name.replace("-py3-", "-1-py3-")
    assert sorted(now) == sorted([n for n in recorded if n != xla_name] + [tagged_name])
    assert now[tagged_name] != recorded[xla_name]
    again = build(syn, env=NOISY)  # the tagged wheel is now the recorded one: a no-op
    assert again.exit_code == 0, again.stderr
    assert shas(syn) == now
    # Wiped once more: an untagged rebuild would shadow the recorded tag-1 file, and
    # BUILD_TAG=1 again would reuse its name; both stop and name the next number.
    wipe_stage_cache(syn)
    untagged = build(syn, env=NOISY)
    assert untagged.exit_code == 1 and "BUILD_TAG=2" in untagged.stderr, untagged.stderr
    reused = build(syn, env={**NOISY, "XLA_WHEELS_BUILD_TAG": "1"})
    assert reused.exit_code == 1 and "BUILD_TAG=2" in reused.stderr, reused.stderr
    assert shas(syn) == now == locked(syn)
    assert build(syn, env={**NOISY, "XLA_WHEELS_KEEP_RECORDED": "1"}).exit_code == 0
    assert shas(syn) == now

    # twine uploads the tagged file next to the published one, pip installs it by hash.
    env = index_server.credentials
    republished = cli(
        syn.root, "publish", "--bundle", "syn", "--index-url", index_server.url, env=env
    )
    assert republished.exit_code == 0, republished.output
    assert republished.stdout.count("uploaded") == 1 and "skipped" in republished.stdout
    on_index = {p.name: file_sha256(p) for p in index_server.packages.iterdir()}
    assert on_index[xla_name] == recorded[xla_name]  # the published file is untouched
    assert on_index[tagged_name] == now[tagged_name]
    verified = cli(
        syn.root, "verify-install", "--bundle", "syn", "--index-url", index_server.url,
        "--no-deps", env=env,
    )  # fmt: skip
    assert verified.exit_code == 0, verified.output
    assert parse_wheel_name(tagged_name).version in verified.stdout


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.slow
def test_everything_written_for_others_follows_the_umask(syn: Synthetic) -> None:
    result = build(syn, umask=0o022)
    assert result.exit_code == 0, result.stderr
    dist = syn.root / "dist" / "syn"
    assert _mode(dist) == 0o755
    for wheel in dist.glob("*.whl"):
        assert _mode(wheel) == 0o644, wheel.name
    for wheel in (syn.cache / "stages").glob("*/*.whl"):
        assert _mode(wheel) == 0o644, wheel
    assert _mode(syn.root / "wheels.lock") == 0o644

    old = os.umask(0o022)
    try:
        published = cli(syn.root, "publish", "--bundle", "syn")  # the static index
    finally:
        os.umask(old)
    assert published.exit_code == 0, published.output
    simple = dist / "simple"
    assert _mode(simple) == 0o755
    for page in simple.rglob("*"):
        assert _mode(page) == (0o755 if page.is_dir() else 0o644), page
    assert _mode(syn.root / "wheels.lock") == 0o644

    # A private umask stays private: the pipeline never widens what the user asked for.
    shutil.rmtree(syn.root / "dist")
    private = build(syn, umask=0o077)
    assert private.exit_code == 0, private.stderr
    assert _mode(dist) == 0o700
    assert {_mode(w) for w in dist.glob("*.whl")} == {0o600}


def _zip(path: Path, entries: list[tuple[str, bytes, tuple[int, ...], int]]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data, date, mode in entries:
            info = zipfile.ZipInfo(name, date_time=date)  # type: ignore[arg-type]
            info.external_attr = mode << 16
            archive.writestr(info, data)
    return path


def test_repack_ignores_order_dates_and_modes_and_tags_builds(tmp_path: Path) -> None:
    record = b"demo/__init__.py,,\ndemo/bin/tool,,\ndemo-1.0.dist-info/WHEEL,,\n"
    files = {
        "demo/__init__.py": (b"", 0o600),
        "demo/bin/tool": (b"#!/bin/sh\n", 0o775),
        "demo-1.0.dist-info/WHEEL": (b"Wheel-Version: 1.0\nTag: py3-none-any\n", 0o664),
        "demo-1.0.dist-info/RECORD": (record, 0o600),
    }
    for name in ("a", "c"):
        (tmp_path / name).mkdir()
    one = _zip(
        tmp_path / "a" / "demo-1.0-py3-none-any.whl",
        [(n, d, (2024, 5, 1, 12, 0, 0), m) for n, (d, m) in files.items()],
    )
    epoch = 0  # before zip's floor: clamped to 1980-01-01
    wheel_stamp.repack_wheel(one, one, epoch, {"demo/_prov.json": b"{}\n"})
    with zipfile.ZipFile(one) as archive:
        infos = archive.infolist()
        assert [i.filename for i in infos][-1] == "demo-1.0.dist-info/RECORD"
        assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
        modes = {i.filename: stat.S_IMODE(i.external_attr >> 16) for i in infos}
    assert modes["demo/bin/tool"] == 0o755 and modes["demo/__init__.py"] == 0o644

    # Same entries, other order, dates and non-executable modes: the same bytes.
    three = _zip(
        tmp_path / "c" / "demo-1.0-py3-none-any.whl",
        [(n, d, (2030, 1, 1, 0, 0, 0), 0o755 if "tool" in n else 0o600)
         for n, (d, _) in reversed(files.items())],
    )  # fmt: skip
    wheel_stamp.repack_wheel(three, three, epoch, {"demo/_prov.json": b"{}\n"})
    assert file_sha256(three) == file_sha256(one)

    tagged = wheel_stamp.with_build_tag(one, "1")
    assert tagged.name == "demo-1.0-1-py3-none-any.whl"
    with zipfile.ZipFile(tagged) as archive:
        assert "Build: 1" in archive.read("demo-1.0.dist-info/WHEEL").decode()
        assert (
            "demo-1.0.dist-info/WHEEL,sha256=" in archive.read("demo-1.0.dist-info/RECORD").decode()
        )


def test_a_patched_torch_gives_torch_xla_another_file_name(syn: Synthetic) -> None:
    # torch_xla is compiled against the torch it is built with: the same torch_xla commit
    # and series on a patched torch is another wheel and must not share the file name
    # (builder.rebuilt_wheels would otherwise stop a bundle that merely patches torch).
    make_patch(
        syn.upstream / "torch",
        syn.commits["torch"],
        "torch",
        "a torch change",
        {"setup.py": (syn.upstream / "torch" / "setup.py").read_text() + "# patched\n"},
        syn.root / "patches" / "torch" / "0001-change.patch",
    )
    syn.write_bundle("patched-torch", torch_patches=("torch/0001-change.patch",))

    def xla_version(bundle: str) -> str:
        plan = run_cli(*cli_args(syn, *HOST, "--dry-run", bundle=bundle), timeout=300)
        assert plan.exit_code == 0, plan.stderr
        found = re.search(r"TORCH_XLA_VERSION=(\S+)", plan.stdout + plan.stderr)
        assert found, plan.stdout
        return found.group(1)

    plain, patched = xla_version("syn"), xla_version("patched-torch")
    assert plain.split("+git")[1][:7] == patched.split("+git")[1][:7]  # the same commit
    assert plain != patched


def cli(root: Path, *args: str, env: dict[str, str] | None = None) -> CliResult:
    """The real CLI edge, in this environment (the machine cache, pip's configuration)."""
    return run_cli(*args, root=root, env=env, inherit_env=True)
