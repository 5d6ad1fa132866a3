"""The gate under a launch profile: the profile's compiler flag reaches every child.

Shown by the cache key, on real stock torch_xla 2.7.0 (whose cache loads) on CPU: the
profile sets ``XLA_FLAGS=--xla_cpu_enable_fast_math=true``; the cache-key check's
fast-math variant, which must change the setting, then runs with ``=false`` (XLA's
default, which torch_xla's __init__ writes when the flag is missing). That variant
misses only if the cold run compiled under the profile's ``=true``: had the flag not
reached the children, it would hit and the check would fail. The caller's shell sets
the opposite flag, which the profile must displace.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gate_helpers import GateRun, run_gate_cli
from tests.test_bundle_manifests import VALID
from xla_wheels.bundle import load_bundle
from xla_wheels.wheels_lock import update_bundle_entry

pytestmark = pytest.mark.slow

PROFILE = """
[profiles.train.device]
PJRT_DEVICE = "TPU"

[profiles.train.compiler]
XLA_NO_SPECIAL_SCALARS = "1"
XLA_FLAGS = "--xla_cpu_enable_fast_math=true"
LIBTPU_INIT_ARGS = "--xla_tpu_enable_flash_attention=false"
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("profile-project")
    (root / "build" / "bundles").mkdir(parents=True)
    (root / "patches" / "torch_xla").mkdir(parents=True)
    (root / "patches" / "torch_xla" / "0001-fix.patch").write_text("diff --git a/x b/x\n")
    (root / "build" / "bundles" / "demo.toml").write_text(VALID + PROFILE)
    update_bundle_entry(root / "wheels.lock", load_bundle(root, "demo"), {}, root)
    return root


@pytest.fixture(scope="module")
def gate_under_profile(project: Path, stock_xla_python_27: Path) -> GateRun:
    return run_gate_cli(
        "gate", "--python", str(stock_xla_python_27), "--device", "CPU",
        "--checks", "cache-key", "--bundle", "demo", "--profile", "train",
        "--root", str(project),
        out_dir=project / "out" / "gate",
        env={"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"},
    )  # fmt: skip


def test_the_profiles_compiler_flag_reaches_the_children(gate_under_profile: GateRun) -> None:
    check = gate_under_profile.check("cache-key")
    assert check["passed"], (check["reasons"], gate_under_profile.stderr[-3000:])
    variants = {v["variant"]: v for v in check["figures"]["variants"]}
    same = variants["warm-same"]
    assert same["hits"] >= 1 and same["xla_compiles"] == 0
    fast_math = variants["warm-fast-math"]
    assert fast_math["setting"].startswith("XLA_FLAGS=--xla_cpu_enable_fast_math=false")
    assert "(the environment sets --xla_cpu_enable_fast_math=true)" in fast_math["setting"]
    assert fast_math["hits"] == 0 and fast_math["xla_compiles"] >= 1


def test_the_run_names_what_the_gate_set_and_what_was_inert(gate_under_profile: GateRun) -> None:
    record = gate_under_profile.report["settings"]["launch_profile"]
    assert record["name"] == "train"
    assert "PJRT_DEVICE" in record["set-by-gate"]
    assert "XLA_NO_SPECIAL_SCALARS" in record["set-by-gate"]
    assert set(record["inert"]) == {"LIBTPU_INIT_ARGS"}
    assert "inert here: LIBTPU_INIT_ARGS (no libtpu on CPU)" in gate_under_profile.stdout


def test_the_receipt_records_the_profile_name_and_digest(
    gate_under_profile: GateRun, project: Path
) -> None:
    (path,) = sorted((project / "receipts" / "demo").glob("*.json"))
    receipt = json.loads(path.read_text())
    digest = load_bundle(project, "demo").profiles["train"].sha256
    assert receipt["profile"]["name"] == "train"
    assert receipt["profile"]["sha256"] == digest
    assert receipt["profile"]["environment"]["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=true"
