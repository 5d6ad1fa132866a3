"""A new host starts warm at launch: ``xla-host launch-env --pack-lane`` and the runtime
image's entrypoint (``XLA_WHEELS_PACK_LANE``) fetch the lane's signed cache pack by hash,
verify it and install it into the launch profile's cache directory before the job, with
``cache fetch``'s own function; a tampered pack installs nothing and stops the launch.

Real parts: openssl keys, a real pack published into a static lane directory served by
``python -m http.server`` on loopback (tests/test_cache_pack_lane.py's fixture), a real
bundle document, and ``python -m xla_host`` / ``python -m xla_host.entrypoint`` run as
processes of an interpreter whose metadata says torch_xla 2.7.0 (no torch_xla import).
The image itself is built in tests/test_runtime_image.py (root, buildah).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.clirunner import REPO_ROOT, CliResult
from tests.publish_support import build_wheel
from tests.test_cache_pack import listing
from tests.test_cache_pack_lane import host_python, lane
from xla_host import bundle_document as doc
from xla_host import lane_packs
from xla_host.launch_profile import LaunchProfile
from xla_host.stamp import read_stamp

__all__ = ["host_python", "lane"]  # the fixtures, shared with test_cache_pack_lane.py

BUNDLE = "v6e-2.11"


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp),
            "PYTHONPATH": str(REPO_ROOT / "host" / "src"), **extra}  # fmt: skip


def _run(python: Path, args: list[str], env: dict[str, str]) -> CliResult:
    done = subprocess.run(
        [str(python), *args], env=env, text=True, capture_output=True, timeout=300, check=False
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


def _document(tmp: Path, cache: Path) -> Path:
    """The bundle's document with a CPU training profile whose cache is ``cache``."""
    profile = LaunchProfile(
        "train",
        {"device": {"PJRT_DEVICE": "CPU"}, "cache": {"XLA_PERSISTENT_CACHE_PATH": str(cache)}},
    )
    document = doc.BundleDocument(
        bundle=BUNDLE,
        lane="validation",
        python="3.11",
        wheels=(doc.LockedFile("torch_xla-2.7.0-cp311-cp311-linux_x86_64.whl", "a" * 64, 10),),
        profiles={"train": profile},
    )
    path = tmp / "document.json"
    path.write_bytes(doc.dumps(document))
    return path


def launch_env(lane: dict[str, object], python: Path, role: str, *extra: str) -> CliResult:
    tmp = Path(str(lane["tmp"]))
    path = _document(tmp, tmp / "host" / "cache")
    return _run(
        python,
        ["-m", "xla_host", "launch-env", "--bundle-document", str(path), "--bundle-sha256",
         doc.sha256_of(path.read_bytes()), "--profile", "train", "--role", role,
         "--out", str(tmp / "launch" / role), "--python", str(python), *extra],
        _env(tmp),
    )  # fmt: skip


def _pack_flags(lane: dict[str, object]) -> list[str]:
    return ["--pack-lane", str(lane["url"]), "--pack-public-key", str(lane["pub"])]


def _tamper(lane: dict[str, object]) -> None:
    """One flipped byte in the middle of the lane's pack file: inside an entry."""
    row = lane["row"]
    assert isinstance(row, lane_packs.PackRow)
    stored = Path(str(lane["dir"])) / row.path
    raw = bytearray(stored.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    stored.write_bytes(bytes(raw))


def test_launch_env_with_a_pack_lane_installs_the_pack_before_the_launch_files(
    lane: dict[str, object], host_python: Path
) -> None:
    tmp = Path(str(lane["tmp"]))
    done = launch_env(lane, host_python, "writer", *_pack_flags(lane), "--pack-workload", "small")
    assert done.exit_code == 0, done.output
    assert listing(tmp / "host" / "cache") == listing(Path(str(lane["cache"])))
    assert "cache pack installed into" in done.stdout and "3 entr(ies) written" in done.stdout
    env = json.loads((tmp / "launch" / "writer" / "env.json").read_text())["environment"]
    assert env["XLA_PERSISTENT_CACHE_PATH"] == str(tmp / "host" / "cache")


def test_launch_env_refuses_a_tampered_pack_and_writes_nothing(
    lane: dict[str, object], host_python: Path
) -> None:
    _tamper(lane)
    tmp = Path(str(lane["tmp"]))
    done = launch_env(lane, host_python, "writer", *_pack_flags(lane))
    assert done.exit_code == 1, done.output
    assert "does not match its signed manifest" in done.stderr and "entry " in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp / "host").exists()  # no entry, no cache directory
    assert not (tmp / "launch").exists()  # and no launch files


def test_launch_env_of_a_reader_fetches_nothing_and_says_so(
    lane: dict[str, object], host_python: Path
) -> None:
    tmp = Path(str(lane["tmp"]))
    done = launch_env(lane, host_python, "reader", *_pack_flags(lane))
    assert done.exit_code == 0, done.output
    assert "not fetched: this job is a reader" in done.stdout
    assert not (tmp / "host").exists()
    # A lane without the key its signature must verify with: refused before anything.
    keyless = launch_env(lane, host_python, "writer", "--pack-lane", str(lane["url"]))
    assert keyless.exit_code == 2, keyless.output
    assert "fix: pass --pack-public-key" in keyless.stderr


@pytest.fixture(scope="module")
def image_python(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An image's environment: a venv with a real torch_xla 2.7.0 wheel (a stand-in
    package, built by setuptools) installed by pip, and the wheel file the facts name."""
    root = tmp_path_factory.mktemp("image")
    wheel = build_wheel(root, "torch_xla", "2.7.0", "torch_xla", {"__init__.py": ""})
    venv.create(root / "venv", with_pip=False)
    python = root / "venv" / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--no-index", str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return python, wheel


def entrypoint(
    lane: dict[str, object], image: tuple[Path, Path], **extra: str
) -> tuple[CliResult, Path, Path]:
    """``python -m xla_host.entrypoint`` with an image's facts (its torch_xla wheel, the
    profile's CPU device and cache path) and a job that lists the cache directory."""
    python, wheel = image
    tmp = Path(str(lane["tmp"]))
    cache = tmp / "job" / "cache"
    facts = tmp / "image.json"
    facts.write_text(json.dumps({
        "bundle": BUNDLE, "lane": "validation", "wheel-dir": str(wheel.parent),
        "wheels": [{"name": wheel.name,
                    "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}],
        "profile": "train", "profile-sha256": None, "receipt-digest": None,
        "environment": {"PJRT_DEVICE": "CPU", "XLA_PERSISTENT_CACHE_PATH": str(cache)},
    }))  # fmt: skip
    stamp = tmp / "stamp.json"
    job = (
        "import os, sys; d = sys.argv[1]; "
        "print('job saw', sorted(os.listdir(d)) if os.path.isdir(d) else [])"
    )
    env = _env(tmp, PJRT_DEVICE="CPU", XLA_PERSISTENT_CACHE_PATH=str(cache),
               XLA_WHEELS_PACK_LANE=str(lane["url"]),
               XLA_WHEELS_PACK_PUBLIC_KEY=str(lane["pub"]), **extra)  # fmt: skip
    done = _run(
        python,
        ["-m", "xla_host.entrypoint", "--facts", str(facts), "--stamp", str(stamp), "--",
         str(python), "-c", job, str(cache)],
        env,
    )  # fmt: skip
    return done, cache, stamp


@pytest.mark.slow
def test_the_entrypoint_installs_the_pack_before_the_job_and_stamps_it(
    lane: dict[str, object], image_python: tuple[Path, Path]
) -> None:
    done, cache, stamp = entrypoint(lane, image_python)
    assert done.exit_code == 0, done.output
    entries = sorted(listing(Path(str(lane["cache"]))))
    assert f"job saw {sorted([*entries, '.xla-packs'])}" in done.stdout  # before it ran
    assert listing(cache) == listing(Path(str(lane["cache"])))
    row = lane["row"]
    assert isinstance(row, lane_packs.PackRow)
    stamped = read_stamp(stamp)
    assert stamped.verdict == "ok"
    assert stamped.cache_pack is not None
    assert stamped.cache_pack.startswith(f"sha256:{row.sha256} ({BUNDLE} / small / cpu-1x1)")


def test_the_entrypoint_stops_the_job_on_a_tampered_pack_unless_told_to_warn(
    lane: dict[str, object], image_python: tuple[Path, Path]
) -> None:
    _tamper(lane)
    done, cache, stamp = entrypoint(lane, image_python)
    assert done.exit_code == 1, done.output
    assert "job saw" not in done.stdout
    assert "does not match its signed manifest" in done.stderr and "entry " in done.stderr
    assert not cache.exists()
    stamped = read_stamp(stamp)
    assert stamped.verdict == "refused" and stamped.cache_pack is None
    assert any(p.startswith("cache pack: ") for p in stamped.problems)
    warned, cache, stamp = entrypoint(lane, image_python, XLA_WHEELS_ON_MISMATCH="warn")
    assert warned.exit_code == 0, warned.output
    assert "job saw []" in warned.stdout  # started cold: nothing of the pack installed
    assert read_stamp(stamp).verdict == "warned"


def test_the_entrypoint_of_a_reader_fetches_nothing(
    lane: dict[str, object], image_python: tuple[Path, Path]
) -> None:
    done, cache, stamp = entrypoint(lane, image_python, XLA_WHEELS_ROLE="reader")
    assert done.exit_code == 0, done.output
    assert "not fetched: this job is a reader" in done.stderr
    assert read_stamp(stamp).cache_pack is None
