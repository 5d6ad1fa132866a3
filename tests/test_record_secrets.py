"""A credential in the launch environment never reaches a record that leaves the process.

The rule (:mod:`xla_host.redact`): inside a flag string (``XLA_FLAGS``, ``LIBTPU_INIT_ARGS``,
a job's command line) a flag's value is masked when the flag's name says it is a
credential or the value looks like one (a URL with credentials, a PEM block, a long
high-entropy token); a variable's value when its name says so. A masked value is
``<redacted sha256:…>``: two different secrets stay different where records are compared.

The guard plants such flags in the environment and writes every kind of record through its
real writer (a receipt, a key record and the signed cache pack that carries it, an audit
stamp), then reads each file back: no secret in any of them, the harmless flags as they
were. What the children run with (the key's input) keeps the real values.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from tests.test_cache_pack import keypair, manifest
from xla_host import cache_keys, cache_pack, receipts, stamp
from xla_host.gate import children
from xla_host.gate.under_profile import GateProfile
from xla_host.launch_profile import EnvDifference
from xla_host.redact import mask_environment, mask_flag_string

# Each a credential a launch script could carry, each caught by another part of the rule.
BY_FLAG_NAME = "hunter2-not-random"  # low entropy: only the flag's name gives it away
IN_URL = "s3cr3t-basic"
BY_VALUE = "Zq8xK2mP9vL4nR7tW1yB3cD6fH0jS5uE"  # a harmless name, a token-shaped value
BY_VARIABLE_NAME = "tpu-auth-0042"
IN_COMMAND = "ghp_Aa1Bb2Cc3Dd4Ee5Ff6Gg7Hh8Ii9Jj0Kk"
SECRETS = (BY_FLAG_NAME, IN_URL, BY_VALUE, BY_VARIABLE_NAME, IN_COMMAND)

XLA_FLAGS = f"--xla_cpu_enable_fast_math=false --xla_remote_auth_token={BY_FLAG_NAME} " \
    "--xla_dump_to=/tmp/dump"  # fmt: skip
LIBTPU_INIT_ARGS = (
    "--xla_tpu_enable_latency_hiding_scheduler=true "
    f"--xla_tpu_cache_url=https://user:{IN_URL}@cache.example/x --xla_tpu_opaque {BY_VALUE}"
)


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XLA_FLAGS", XLA_FLAGS)
    monkeypatch.setenv("LIBTPU_INIT_ARGS", LIBTPU_INIT_ARGS)
    monkeypatch.setenv("TPU_AUTH_TOKEN", BY_VARIABLE_NAME)


def assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{where} holds {secret!r}"
    assert "<redacted sha256:" in text, where


@pytest.mark.parametrize(
    "flags",
    [
        "--xla_dump_to=/tmp/x/y",
        "--xla_cpu_enable_fast_math=true --xla_tpu_memory_limit_ratio=0.95",
        "--xla_gpu_target_config_filename=configs/v6e.txt --mode fast",
        "--xla_dump_hlo_pass_re=.* --xla_force_host_platform_device_count=8",
        "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
    ],
)
def test_harmless_flags_are_recorded_as_they_are(flags: str) -> None:
    assert mask_flag_string(flags) == flags


@pytest.mark.parametrize(
    ("flags", "secret"),
    [
        ("--auth_token=abc123", "abc123"),  # by the name, = form
        ("--api-key abc123 --next=1", "abc123"),  # by the name, space form
        ("--client_secret='two words'", "two words"),  # quoted
        ("--xla_x=https://u:pw123@host/path", "pw123"),  # by the value: URL userinfo
        ("--xla_x=https://host/p?sig=abcdef12", "abcdef12"),  # by the value: URL query
        (f"--xla_x={BY_VALUE}", BY_VALUE),  # by the value: a long high-entropy token
        ('--cert="-----BEGIN PRIVATE KEY-----MIIB"', "MIIB"),  # by the value: a PEM block
    ],
)
def test_a_flag_that_holds_a_credential_is_masked_by_name_or_by_value(
    flags: str, secret: str
) -> None:
    shown = mask_flag_string(flags)
    assert secret not in shown and "<redacted sha256:" in shown
    assert shown.startswith(flags.split("=")[0].split(" ")[0])  # the flag's name stays


def test_masked_values_still_tell_two_secrets_apart_and_one_secret_alike() -> None:
    one = mask_environment({"XLA_FLAGS": "--token=aaa1"})["XLA_FLAGS"]
    again = mask_environment({"XLA_FLAGS": "--token=aaa1"})["XLA_FLAGS"]
    other = mask_environment({"XLA_FLAGS": "--token=bbb2"})["XLA_FLAGS"]
    assert one == again and one != other


@pytest.mark.usefixtures("planted")
def test_the_children_run_with_the_real_flags_and_the_record_masks_them() -> None:
    # The key is taken from what the children get: the real values.
    run_with = children.runtime_env("CPU")
    assert run_with["XLA_FLAGS"] == XLA_FLAGS and run_with["LIBTPU_INIT_ARGS"] == LIBTPU_INIT_ARGS
    recorded = children.launch_environment("CPU")
    assert_no_secret(repr(recorded), "the launch environment")
    assert "--xla_dump_to=/tmp/dump" in recorded["XLA_FLAGS"]
    assert "--xla_tpu_enable_latency_hiding_scheduler=true" in recorded["LIBTPU_INIT_ARGS"]


def _receipt(launch_environment: dict[str, str], profile: dict[str, Any] | None = None) -> Any:
    return receipts.Receipt(
        kind="gate", bundle="v6e-2.9", created="2026-01-01T00:00:00Z", host="h", device="CPU",
        chip=None, workload="small", versions={}, wheels_match_lock=False, wheels=(),
        problems=(), checks=(receipts.CheckEvidence("restart", True, (), {}),),
        profile=profile, launch_environment=launch_environment,
    )  # fmt: skip


def _compile_side() -> dict[str, Any]:
    """The key probe child's own reading of the flags (it runs in the children)."""
    path = Path(children.__file__).with_name("key_probe_child.py")
    spec = importlib.util.spec_from_file_location("_key_probe_child_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    side: dict[str, Any] = module.compile_side({"opaque_option": BY_VALUE})
    return side


@pytest.mark.usefixtures("planted")
def test_every_record_a_run_writes_holds_no_secret_of_its_environment(tmp_path: Path) -> None:
    written: dict[str, str] = {}
    # A receipt: the launch environment and the profile's.
    profile = GateProfile("train", "0" * 64, {"XLA_FLAGS": XLA_FLAGS, "TPU_AUTH_TOKEN": "x1"})
    made = _receipt(children.launch_environment("CPU"), profile.record())
    path = receipts.write_receipt(receipts.receipt_path(tmp_path / "root", made), made)
    written["receipt"] = path.read_text()
    # A key record (keys.json, `cache record --out`) and the signed pack that carries it.
    side = _compile_side()
    assert side["xla_flags"]["xla_remote_auth_token"] == BY_FLAG_NAME  # the child saw it
    record = cache_keys.make_record(
        {"components": {"compile_options": side, "module_switches": {}}, "graphs": []},
        "small", "cpu-1x1",
    )  # fmt: skip
    written["key record"] = repr(record)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "123456789012").write_bytes(os.urandom(100))
    private, public = keypair(tmp_path, "pack")
    keys = cache_keys.manifest_keys(record, ["123456789012"])
    pack, _ = cache_pack.write_pack(tmp_path / "packs", cache, private, manifest(keys=keys))
    read_back = cache_pack.read_manifest(str(pack), [cache_pack.read_public_key(public)])
    written["pack manifest"] = repr(read_back.to_json())
    # An audit stamp: the job's command line and the environment's differences.
    differences = (
        EnvDifference("XLA_FLAGS", "different", "--xla_dump_to=/d", XLA_FLAGS),
        EnvDifference("TPU_AUTH_TOKEN", "extra", None, BY_VARIABLE_NAME),
    )
    job = stamp.Stamp(
        created="2026-01-01T00:00:00Z", host="h", bundle="v6e-2.9", lane=None, wheels=(),
        receipt_digest=None, profile=None, profile_sha256=None, cache_path=None, role=None,
        verdict="warned", problems=tuple(d.describe() for d in differences),
        job=stamp.job_facts({}, ["python", "train.py", f"--hf-token={IN_COMMAND}"]),
    )  # fmt: skip
    written["stamp"] = stamp.write_stamp(tmp_path / "job.json", job).read_text()
    for where, text in written.items():
        assert_no_secret(text, where)
    assert "--xla_cpu_enable_fast_math=false" in written["receipt"]
    assert "train.py" in written["stamp"]


@pytest.mark.usefixtures("planted")
def test_receipts_under_different_secrets_still_differ_where_they_are_compared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = _receipt(children.launch_environment("CPU"))
    same = _receipt(children.launch_environment("CPU"))
    monkeypatch.setenv("XLA_FLAGS", XLA_FLAGS.replace(BY_FLAG_NAME, "another-password"))
    other = _receipt(children.launch_environment("CPU"))
    assert receipts.environment_difference(first, same) is None
    difference = receipts.environment_difference(first, other)
    assert difference is not None and difference.startswith("XLA_FLAGS")
    assert BY_FLAG_NAME not in difference and "another-password" not in difference
