"""The compilation-cache contract doctor checks: pure rules, no host needed."""

from __future__ import annotations

from dataclasses import replace

from xla_host.cache_contract import (
    DEFAULT_ROOT,
    CacheFacts,
    directory_name,
    judge_cache_contract,
    missing_from_path,
    recommended_path,
)

PATCHED = "2.9.0+gitc04e61c.p1a2b3c4d"
GOOD_DIR = f"/mnt/cache/xla_cache_v6e-2.9_txla{PATCHED}_libtpu0.0.36"
FACTS = CacheFacts(
    bundle="v6e-2.9",
    path=GOOD_DIR,
    torch_xla_version=PATCHED,
    libtpu_version="0.0.36",
    role="writer",
    read_only=False,
)


def findings(facts: CacheFacts) -> dict[str, tuple[str, str, str]]:
    return {f.check: (f.status, f.detail, f.fix) for f in judge_cache_contract(facts)}


def test_the_directory_name_carries_bundle_full_torch_xla_version_and_libtpu():
    assert directory_name("v6e-2.9", PATCHED, "0.0.36") == (
        "xla_cache_v6e-2.9_txla2.9.0+gitc04e61c.p1a2b3c4d_libtpu0.0.36"
    )
    assert directory_name("b", "2.9.0", None) == "xla_cache_b_txla2.9.0"
    # Nothing that could escape the parent directory or break a shell word.
    assert directory_name("a/b c", "2.9.0", None) == "xla_cache_a_b_c_txla2.9.0"


def test_a_path_naming_the_build_and_libtpu_passes_and_is_recommended_as_is():
    result = findings(FACTS)
    assert result["cache path build"][0] == "ok"
    assert result["cache path recommended"] == ("ok", GOOD_DIR, "")
    assert result["cache role"] == ("ok", "writer, writes", "")


def test_the_users_version_only_name_misses_the_patch_label_and_libtpu():
    # What users name their directories today: two libtpu versions or two patch series
    # of the same torch_xla release would share it.
    facts = replace(FACTS, path="/mnt/cache/xla_cache_v6e_txla2.9.0")
    status, detail, fix = findings(facts)["cache path build"]
    assert status == "FAIL"
    assert "local label +gitc04e61c.p1a2b3c4d" in detail and "libtpu version 0.0.36" in detail
    assert "torch_xla version 2.9.0" not in detail
    assert fix == f"export XLA_PERSISTENT_CACHE_PATH={GOOD_DIR}"


def test_a_path_for_the_other_libtpu_fails():
    facts = replace(FACTS, libtpu_version="0.0.37")
    assert missing_from_path(GOOD_DIR, PATCHED, "0.0.37") == ["the libtpu version 0.0.37"]
    assert findings(facts)["cache path build"][0] == "FAIL"


def test_a_reader_must_be_read_only_and_the_writer_must_not_be():
    reader = findings(replace(FACTS, role="reader"))["cache role"]
    assert reader[0] == "FAIL" and reader[2] == "export XLA_PERSISTENT_CACHE_READ_ONLY=1"
    assert findings(replace(FACTS, role="reader", read_only=True))["cache role"][0] == "ok"
    assert findings(replace(FACTS, read_only=True))["cache role"][0] == "FAIL"
    assert "cache role" not in findings(replace(FACTS, role=None))


def test_without_a_path_the_recommendation_is_under_the_default_root():
    facts = replace(FACTS, path=None)
    assert (
        recommended_path(facts) == f"{DEFAULT_ROOT}/{directory_name('v6e-2.9', PATCHED, '0.0.36')}"
    )
    assert "cache path build" not in findings(facts)


def test_missing_torch_xla_or_libtpu_is_a_warning_not_a_guess():
    none = findings(replace(FACTS, torch_xla_version=None))
    assert none["cache path build"][0] == "WARN"
    assert "cache path recommended" not in none
    no_tpu = findings(replace(FACTS, libtpu_version=None, path="/c/xla_cache_b_txla" + PATCHED))
    assert no_tpu["cache path build"][0] == "ok"
    assert no_tpu["cache path libtpu"][0] == "WARN"
