"""Launch profiles in a bundle: validated at load, inherited, diffed, locked, written for a
launcher, and applied before torch_xla by the standard-library helper."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.clirunner import run_cli
from tests.gitrepos import REPO_ROOT
from tests.test_bundle_manifests import VALID
from xla_host.errors import ManifestError
from xla_host.launch_profile import compare_environment, is_training_profile, read_env_file
from xla_wheels.bundle import diff, load_bundle
from xla_wheels.wheels_lock import (
    WheelRecord,
    check_lock,
    read_lock,
    record_wheels,
    update_bundle_entry,
)

TRAIN = """
[profiles.train.device]
PJRT_DEVICE = "TPU"

[profiles.train.cache]
XLA_PERSISTENT_CACHE_PATH = "/mnt/xla-cache/{bundle}/{profile}"

[profiles.train.compiler]
XLA_NO_SPECIAL_SCALARS = "1"
LIBTPU_INIT_ARGS = "--xla_tpu_enable_flash_attention=false --xla_latency_hiding_scheduler_rerun=1"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "build" / "bundles").mkdir(parents=True)
    (tmp_path / "patches" / "torch_xla").mkdir(parents=True)
    (tmp_path / "patches" / "torch_xla" / "0001-fix.patch").write_text("diff --git a/x b/x\n")
    (tmp_path / "build" / "bundles" / "demo.toml").write_text(VALID + TRAIN)
    return tmp_path


def manifest_error(project: Path, profiles: str) -> str:
    (project / "build" / "bundles" / "demo.toml").write_text(VALID + profiles)
    with pytest.raises(ManifestError) as caught:
        load_bundle(project, "demo")
    return f"{caught.value.message}\nfix: {caught.value.fix}"


def test_a_profile_is_read_grouped_by_purpose_with_its_digest(project: Path) -> None:
    profile = load_bundle(project, "demo").profiles["train"]
    assert is_training_profile(profile.name)
    assert dict(profile.groups["device"]) == {"PJRT_DEVICE": "TPU"}
    assert profile.environment("demo", "reader") == {
        "LIBTPU_INIT_ARGS": "--xla_tpu_enable_flash_attention=false "
        "--xla_latency_hiding_scheduler_rerun=1",
        "PJRT_DEVICE": "TPU",
        "XLA_NO_SPECIAL_SCALARS": "1",
        "XLA_PERSISTENT_CACHE_PATH": "/mnt/xla-cache/demo/train",
        "XLA_PERSISTENT_CACHE_READ_ONLY": "1",
    }
    assert profile.environment("demo", "writer")["XLA_PERSISTENT_CACHE_READ_ONLY"] == "0"
    assert len(profile.sha256) == 64


# Each row: a [profiles.<profile>.<group>] table, its body, and words the error must contain
# (the problem and the fix).
BAD_PROFILES = [
    ("train.network", 'PJRT_DEVICE = "TPU"', ["unknown group", "device, cache"]),
    ("train.device", 'PJRT_DEVICES = "TPU"', ["not a variable", "fix the name"]),
    ("train.compiler", 'PJRT_DEVICE = "TPU"',
     ["belongs in the device group", "[profiles.train.device]"]),
    ("train.compiler", "XLA_NO_SPECIAL_SCALARS = 1",
     ["expected a string", 'XLA_NO_SPECIAL_SCALARS = "1"']),
    ("train.compiler", 'XLA_FLAGS = "--xla_a=1\\t--xla_b=2"', ["is not a flag", "one space"]),
    ("train.compiler", "XLA_FLAGS = \"'--xla_a=1'\"", ["is not a flag", "without quotes"]),
    ("train.compiler", 'XLA_FLAGS = "--xla_a=1  --xla_b=2"', ["doubled spaces", "one space"]),
    ("train.compiler", 'LIBTPU_INIT_ARGS = "--xla_x=1 --xla_y=2 --xla_x=3"',
     ["--xla_x is given twice", "keep one"]),
    ("train.compiler", 'XLA_FLAGS = "--xla_a=1"\nLIBTPU_INIT_ARGS = "--xla_a=2"',
     ["both XLA_FLAGS and LIBTPU_INIT_ARGS", "keep it in one"]),
    ("train.compiler", 'XLA_FLAGS = "--xla_tpu_enable_flash_attention=false"',
     ["TPU compiler flag", "move it to LIBTPU_INIT_ARGS"]),
    ("train.debug", 'XLA_IR_DEBUG = "1"',
     ["debug switch XLA_IR_DEBUG=1 is on in the training profile", 'XLA_IR_DEBUG = "0"']),
    ("train-bf16.debug", 'XLA_HLO_DEBUG = "true"', ["training profile train-bf16", "remove it"]),
    ("train.debug", 'XLA_SAVE_HLO_FILE = "/tmp/hlo"', ["writes dumps", "[profiles.debug]"]),
    ("train.compiler", 'XLA_FLAGS = "--xla_dump_to=/tmp/d"',
     ["dumps compiler output in a training profile", "remove it"]),
    ("train.cache", 'XLA_PERSISTENT_CACHE_READ_ONLY = "1"',
     ["decided by the launch role", "ROLE=reader"]),
    ("train.cache", 'XLA_PERSISTENT_CACHE_PATH = "cache/{bundle}"',
     ["not an absolute path", "/mnt/xla-cache"]),
    ("train.cache", 'XLA_PERSISTENT_CACHE_PATH = "/c/{host}"',
     ["placeholder other than", "{bundle}"]),
    ("Train.device", 'PJRT_DEVICE = "TPU"', ["not a profile name", "lowercase"]),
]  # fmt: skip


@pytest.mark.parametrize(("table", "body", "words"), BAD_PROFILES)
def test_a_bad_profile_is_refused_at_load_naming_the_key_and_the_fix(
    project: Path, table: str, body: str, words: list[str]
) -> None:
    text = manifest_error(project, f"[profiles.{table}]\n{body}\n")
    assert "demo.toml: key 'profiles." in text
    for word in words:
        assert word in text


def test_debug_switches_and_dumps_are_allowed_outside_a_training_profile(project: Path) -> None:
    (project / "build" / "bundles" / "demo.toml").write_text(
        VALID + '[profiles.debug.debug]\nXLA_IR_DEBUG = "1"\nXLA_SAVE_HLO_FILE = "/tmp/h"\n'
        '[profiles.debug.compiler]\nXLA_FLAGS = "--xla_dump_to=/tmp/d"\n'
    )
    assert load_bundle(project, "demo").profiles["debug"].settings["XLA_IR_DEBUG"] == "1"


def test_a_bad_profile_exits_2_with_error_and_fix_at_the_cli(project: Path) -> None:
    (project / "build" / "bundles" / "demo.toml").write_text(
        VALID + '[profiles.train.debug]\nXLA_HLO_DEBUG = "1"\n'
    )
    result = run_cli("bundles", root=project)
    assert result.exit_code == 2
    assert "error:" in result.stderr and "fix:" in result.stderr
    assert "Traceback" not in result.stderr


def test_profiles_are_inherited_group_by_group_and_diff_shows_the_change(project: Path) -> None:
    child = (
        '[bundle]\nname = "child"\nextends = "demo"\n\n'
        '[profiles.train.compiler]\nXLA_NO_SPECIAL_SCALARS = "1"\n'
    )
    (project / "build" / "bundles" / "child.toml").write_text(child)
    parent, kid = load_bundle(project, "demo"), load_bundle(project, "child")
    # device and cache come from the parent; the child's compiler group replaced the
    # parent's as a whole (its LIBTPU_INIT_ARGS is gone), and {bundle} is the child's name.
    assert kid.profiles["train"].settings["PJRT_DEVICE"] == "TPU"
    assert "LIBTPU_INIT_ARGS" not in kid.profiles["train"].settings
    assert kid.profiles["train"].environment("child", "writer")["XLA_PERSISTENT_CACHE_PATH"] == (
        "/mnt/xla-cache/child/train"
    )
    assert kid.profiles["train"].sha256 != parent.profiles["train"].sha256
    rows = diff(parent, kid)
    assert (
        "profile.train.LIBTPU_INIT_ARGS",
        "--xla_tpu_enable_flash_attention=false --xla_latency_hiding_scheduler_rerun=1",
        "-",
    ) in rows
    shown = run_cli("diff", "demo", "child", root=project)
    assert shown.exit_code == 0 and "profile.train.LIBTPU_INIT_ARGS" in shown.stdout


def test_the_lock_records_each_profile_digest_and_lock_check_names_a_changed_one(
    project: Path,
) -> None:
    lock = project / "wheels.lock"
    bundle = load_bundle(project, "demo")
    update_bundle_entry(lock, bundle, {}, project)
    assert read_lock(lock).entry("demo").profiles == {"train": bundle.profiles["train"].sha256}
    assert check_lock(project, lock) == []
    manifest = project / "build" / "bundles" / "demo.toml"
    manifest.write_text(manifest.read_text().replace('"TPU"', '"CPU"'))
    problems = check_lock(project, lock)
    assert any("launch profile train is sha256" in p for p in problems), problems


def test_the_shipped_bundles_have_a_train_profile_that_the_lock_records() -> None:
    lock = read_lock(REPO_ROOT / "wheels.lock")
    for name in ("v6e-2.9", "v6e-2.11"):
        profile = load_bundle(REPO_ROOT, name).profiles["train"]
        assert profile.settings["PJRT_DEVICE"] == "TPU"
        assert profile.settings["XLA_NO_SPECIAL_SCALARS"] == "1"
        assert "XLA_IR_DEBUG" not in profile.settings
        assert lock.entry(name).profiles["train"] == profile.sha256


def test_launch_env_writes_a_sourceable_quoted_file_and_a_json_one(
    project: Path, tmp_path: Path
) -> None:
    manifest = project / "build" / "bundles" / "demo.toml"
    # A path with a space and a quote: the shell file must keep it one value.
    manifest.write_text(manifest.read_text().replace("/mnt/xla-cache/", "/mnt/x la'cache/"))
    (project / "scripts").mkdir()
    (project / "scripts" / "xla_launch_profile.py").write_text(
        (REPO_ROOT / "scripts" / "xla_launch_profile.py").read_text()
    )
    out = tmp_path / "launch"
    result = run_cli(
        "launch-env", "--bundle", "demo", "--profile", "train", "--role", "reader",
        "--out", str(out), root=project,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    sourced = subprocess.run(
        ["bash", "-c", f". {out / 'env.sh'} && env -0"], capture_output=True, check=True
    ).stdout.decode()
    env = dict(item.split("=", 1) for item in sourced.split("\0") if "=" in item)
    document = json.loads((out / "env.json").read_text())
    assert document["role"] == "reader" and document["profile"] == "train"
    for key, value in document["environment"].items():
        assert env[key] == value
    assert env["XLA_PERSISTENT_CACHE_PATH"] == "/mnt/x la'cache/demo/train"
    assert env["XLA_PERSISTENT_CACHE_READ_ONLY"] == "1"
    assert read_env_file(out / "env.sh") == document["environment"]
    assert (out / "xla_launch_profile.py").is_file()
    unknown_role = run_cli(
        "launch-env", "--bundle", "demo", "--profile", "train", "--role", "leader", root=project
    )
    assert unknown_role.exit_code == 2 and "ROLE=reader" in unknown_role.stderr


def _helper() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "xla_launch_profile", REPO_ROOT / "scripts" / "xla_launch_profile.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _profile_json(tmp_path: Path, environment: dict[str, str]) -> Path:
    path = tmp_path / "env.json"
    path.write_text(json.dumps({"bundle": "b", "profile": "train", "environment": environment}))
    return path


def test_the_helper_applies_a_profile_and_refuses_conflicts(tmp_path: Path) -> None:
    helper = _helper()
    path = _profile_json(tmp_path, {"PJRT_DEVICE": "TPU", "XLA_FLAGS": "--xla_a=1"})
    environ = {"PATH": "/bin", "XLA_IR_DEBUG": "1"}
    with pytest.raises(helper.ProfileConflict, match="XLA_IR_DEBUG='1' is set but not in"):
        helper.apply(path, environ=environ, modules={})
    helper.apply(path, environ=environ, modules={}, replace=True)
    assert environ == {"PATH": "/bin", "PJRT_DEVICE": "TPU", "XLA_FLAGS": "--xla_a=1"}
    with pytest.raises(helper.ProfileConflict, match="PJRT_DEVICE='CPU' is set"):
        helper.apply(path, environ={"PJRT_DEVICE": "CPU"}, modules={})


def test_the_helper_refuses_after_torch_xla_is_imported(
    tmp_path: Path, stock_xla_python_29: Path
) -> None:
    """In the real stock torch_xla environment: apply() before the import works and the
    runtime sees the setting; after the import it refuses."""
    python = stock_xla_python_29
    path = _profile_json(tmp_path, {"PJRT_DEVICE": "CPU", "XLA_NO_SPECIAL_SCALARS": "1"})
    program = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT / "scripts")!r})
import xla_launch_profile
xla_launch_profile.apply({str(path)!r})
import torch_xla, torch_xla.runtime as xr
print("device", xr.device_type())
try:
    xla_launch_profile.apply({str(path)!r})
except xla_launch_profile.ProfileAppliedTooLate as error:
    print("refused:", error)
"""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(python), "-c", program], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "device CPU" in done.stdout
    assert "refused: torch_xla is already imported" in done.stdout


def test_compare_environment_names_missing_extra_and_different_settings() -> None:
    expected = {
        "PJRT_DEVICE": "TPU",
        "XLA_FLAGS": "--xla_a=1 --xla_b=2",
        "XLA_NO_SPECIAL_SCALARS": "1",
    }
    actual = {"PJRT_DEVICE": "TPU", "XLA_FLAGS": "--xla_b=2 --xla_a=1", "XLA_IR_DEBUG": "1",
              "LIBTPU_INIT_ARGS": "--xla_x=1", "PATH": "/bin"}  # fmt: skip
    found = {d.variable: d for d in compare_environment(expected, actual)}
    assert set(found) == {"XLA_NO_SPECIAL_SCALARS", "XLA_IR_DEBUG", "LIBTPU_INIT_ARGS"}
    assert found["XLA_NO_SPECIAL_SCALARS"].kind == "missing"
    assert found["XLA_IR_DEBUG"].kind == "extra" and found["XLA_IR_DEBUG"].in_cache_key
    assert "in the compile cache's key" in found["LIBTPU_INIT_ARGS"].describe()


def test_launch_env_fills_the_build_into_the_cache_path_from_the_locked_wheel(
    project: Path, tmp_path: Path
) -> None:
    manifest = project / "build" / "bundles" / "demo.toml"
    manifest.write_text(manifest.read_text().replace("/mnt/xla-cache/{bundle}/{profile}",
                                                     "/mnt/xla-cache/{build}"))  # fmt: skip
    (project / "scripts").mkdir()
    (project / "scripts" / "xla_launch_profile.py").write_text("")
    lock = project / "wheels.lock"
    update_bundle_entry(lock, load_bundle(project, "demo"), {}, project)
    unbuilt = run_cli("launch-env", "--bundle", "demo", "--profile", "train", "--role",
                      "writer", root=project)  # fmt: skip
    assert unbuilt.exit_code == 2 and "records no torch_xla wheel for demo" in unbuilt.stderr
    wheel = "torch_xla-2.9.0+gitc04e61c.p0123abcd-cp313-cp313-linux_x86_64.whl"
    record_wheels(lock, "demo", [WheelRecord(wheel, 1, "0" * 64)])
    out = tmp_path / "launch"
    built = run_cli("launch-env", "--bundle", "demo", "--profile", "train", "--role", "writer",
                    "--out", str(out), root=project)  # fmt: skip
    assert built.exit_code == 0, built.stderr
    env = json.loads((out / "env.json").read_text())["environment"]
    # The cache contract's name: the bundle, the full torch_xla version, the libtpu hosts install.
    assert env["XLA_PERSISTENT_CACHE_PATH"] == (
        "/mnt/xla-cache/xla_cache_demo_txla2.9.0+gitc04e61c.p0123abcd_libtpu0.0.36"
    )


def test_doctor_names_each_setting_where_a_launch_environment_differs_from_the_profile(
    project: Path, tmp_path: Path
) -> None:
    """make doctor PROFILE=train ENV_FILE=…: the env file launch-env wrote is the profile;
    one edited the way hosts drift names every difference and the cache-key ones."""
    (project / "scripts").mkdir()
    (project / "scripts" / "xla_launch_profile.py").write_text("")
    update_bundle_entry(project / "wheels.lock", load_bundle(project, "demo"), {}, project)
    out = tmp_path / "launch"
    written = run_cli(
        "launch-env", "--bundle", "demo", "--profile", "train", "--role", "reader",
        "--out", str(out), root=project,
    )  # fmt: skip
    assert written.exit_code == 0, written.stderr

    def doctor(env_file: Path) -> str:
        result = run_cli(
            "doctor", "--bundle", "demo", "--python", sys.executable, "--role", "reader",
            "--profile", "train", "--env-file", str(env_file), root=project,
        )  # fmt: skip
        assert "Traceback" not in result.stderr
        return result.stdout

    assert re.search(r"ok +profile train +.*env.sh is launch profile train", doctor(out / "env.sh"))
    drifted = tmp_path / "drifted.sh"
    text = (out / "env.sh").read_text().replace("export XLA_NO_SPECIAL_SCALARS=1\n", "")
    text = text.replace("flash_attention=false", "flash_attention=true")
    drifted.write_text(text + "export XLA_HLO_DEBUG=1\nexport TF_CPP_MIN_LOG_LEVEL=0\n")
    report = doctor(drifted)
    assert re.search(
        r"FAIL profile train +XLA_NO_SPECIAL_SCALARS is not set; the profile sets", report
    )
    assert re.search(r"FAIL profile train +LIBTPU_INIT_ARGS=.*flash_attention=true.*, the "
                     r"profile says .*flash_attention=false.*\(in the compile cache's key\)",
                     report)  # fmt: skip
    assert re.search(r"FAIL profile train +XLA_HLO_DEBUG=1 is set but not in the profile "
                     r"\(in the compile cache's key\)", report)  # fmt: skip
    assert re.search(
        r"WARN profile train +TF_CPP_MIN_LOG_LEVEL=0 is set but not in the profile", report
    )
