"""Verdicts of the cache-key, same-numbers, SPMD warm-restart and upstream-test checks.

Pure functions on rows written the way ``restart.summarize`` writes them (fast); the same
rules meet real torch_xla 2.7.0 / 2.9.0 in test_gate_cache_checks.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xla_host.gate import cachekeys, restart, upstream_tests
from xla_host.gate.children import ChildResult
from xla_host.gate.stacks import summarize_stacks
from xla_host.gate.upstream_tests import CaseResult

LOSSES = [0.9952931404113770, 0.9952921867370605]
LOSS_HEX = [v.hex() for v in LOSSES]


def row(
    tmp_path: Path,
    name: str,
    *,
    misses: int = 0,
    hits: int = 0,
    compiles: int = 0,
    loss_hex: list[str] | None = None,
    timed_out: bool = False,
    extra: dict[str, Any] | None = None,
    report_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    log_path = tmp_path / f"{name}.log"
    log_path.write_text("")
    report: dict[str, Any] | None = {
        "ok": True,
        "import_s": 5.0,
        "ready_s": 1.0 if misses else 0.2,
        "first_step": {
            "setup_s": 0.1,
            "trace_s": 0.1,
            "sync_s": 0.7 if misses else 0.05,
            "execute_s": 0.1,
            "sync_cpu_s": 0.9 if misses else 0.02,
        },
        "xla_compiles": compiles,
        "counters": {
            "PersistentCacheMiss": misses,
            "PersistentCacheHit": hits,
            "PersistentCacheDeserializeFailure": 0,
        },
        "loss_hex": LOSS_HEX if loss_hex is None else loss_hex,
        **(report_extra or {}),
    }
    if timed_out:
        report = None
    result = ChildResult(name, None if timed_out else 0, 75.0, report, log_path)
    result.timed_out = timed_out
    result.extra = dict(extra or {})
    return restart.summarize(result)


# --- SPMD warm restart: the hang bound and its report ------------------------------------


def test_the_hang_bound_is_a_multiple_of_the_cold_run_plus_a_margin_capped_by_the_timeout():
    config = restart.RestartConfig(hang_factor=3.0, hang_margin_s=30.0, child_timeout_s=600.0)
    assert restart.hang_bound_s(15.0, config) == 75.0
    assert restart.hang_bound_s(400.0, config) == 600.0


def test_the_spmd_variant_runs_at_least_five_steps_on_four_cpu_devices():
    config = restart.spmd_config(restart.RestartConfig(steps=2, record_baseline=True))
    assert config.name == "spmd-restart" and config.spmd
    assert config.steps is not None and config.steps >= restart.SPMD_MIN_STEPS >= 5
    assert config.cpu_devices == 4
    assert not config.record_baseline
    assert restart._train_args(config)[-3:] == ["--spmd", "--steps", str(config.steps)]
    given = restart.spmd_config(restart.RestartConfig(cache_dir=Path("/c")))
    assert given.cache_dir == Path("/c/spmd-restart")  # not the single-device check's cache


def test_a_hung_warm_run_fails_naming_the_bound_and_the_native_stacks(tmp_path):
    cold = [row(tmp_path, "cold-1", misses=2, compiles=2)]
    hung = row(
        tmp_path,
        "warm-1",
        timed_out=True,
        extra={
            "stacks": "/runs/warm-1.stacks.txt",
            "stacks_summary": {"threads": 20, "telling_frames": ["AwaitAndLogIfStuck (4 threads)"]},
        },
    )
    hung.update({"hang_bound_s": 75.0, "hang_rule": "3 x the cold run's 15s + 30s"})
    config = restart.spmd_config(restart.RestartConfig())
    result = restart.judge_restart(cold, [hung], None, {"k": (1, 1)}, None, config, None)
    assert not result.passed
    assert result.name == "spmd-restart"
    assert result.reasons[0] == (
        "warm-1 hung: no result within 75s (3 x the cold run's 15s + 30s); process group "
        "killed; native stacks of 20 threads in /runs/warm-1.stacks.txt "
        "(stuck in: AwaitAndLogIfStuck (4 threads))"
    )
    assert result.figures["hung"] == ["warm-1"]


def test_a_stalled_warm_run_fails_naming_the_stall_and_its_bound(tmp_path):
    cold = [row(tmp_path, "cold-1", misses=2, compiles=2)]
    hung = row(tmp_path, "warm-1", timed_out=True, extra={"stalled_s": 15.0})
    hung.update({"hang_bound_s": 75.0, "hang_rule": "3 x the cold run's 15s + 30s"})
    result = restart.judge_restart(cold, [hung], None, {}, None, restart.RestartConfig(), None)
    assert result.reasons[0].startswith("warm-1 hung: used no CPU time for 15s (on CPU ")
    assert (
        "of its 75s bound (3 x the cold run's 15s + 30s); process group killed"
        in (result.reasons[0])
    )


def test_a_hang_without_gdb_says_there_are_no_stacks_and_why(tmp_path):
    hung = row(tmp_path, "warm-1", timed_out=True, extra={"stacks_error": "gdb is not installed"})
    hung.update({"hang_bound_s": 75.0, "hang_rule": "r"})
    cold = [row(tmp_path, "cold-1", misses=2, compiles=2)]
    result = restart.judge_restart(cold, [hung], None, {}, None, restart.RestartConfig(), None)
    assert result.reasons[0].endswith("; no native stacks: gdb is not installed")


def test_summarize_stacks_counts_threads_and_the_frames_they_wait_in():
    text = (
        'Thread 3 (Thread 0x7f (LWP 12) "python"):\n'
        "#6  0x1 in xla::internal::AwaitAndLogIfStuck(xla::internal::Rendezvous) ()\n"
        "#8  0x2 in xla::cpu::InProcessCommunicator::AllReduce(a, b) ()\n"
        "#11 0x3 in xla::cpu::AllReduceThunk::Execute(p) ()\n"
        'Thread 2 (Thread 0x7e (LWP 11) "python"):\n'
        "#6  0x1 in xla::internal::AwaitAndLogIfStuck(xla::internal::Rendezvous) ()\n"
        'Thread 1 (Thread 0x7d (LWP 10) "python"):\n'
        "#0  0x4 in __futex_abstimed_wait_common64 () from libc.so.6\n"
    )
    summary = summarize_stacks(text)
    assert summary["threads"] == 3
    assert summary["telling_frames"][0] == "internal::AwaitAndLogIfStuck (2 threads)"


# --- same numbers ------------------------------------------------------------------------


def test_losses_must_match_bit_for_bit(tmp_path):
    cold = row(tmp_path, "cold", misses=2, compiles=2)
    # The neighbouring float: equal to 6 decimals, not bit for bit.
    nudged = [LOSS_HEX[0], float.fromhex(LOSS_HEX[1]).__add__(2**-40).hex()]
    warm = row(tmp_path, "warm-same", hits=2, loss_hex=nudged)
    assert restart.same_losses([cold, row(tmp_path, "w", hits=2)]) == []
    reasons = restart.same_losses([cold, warm])
    assert len(reasons) == 1 and reasons[0].startswith("warm-same: losses")
    result = cachekeys.judge_same_numbers(cold, [warm], None, None)
    assert not result.passed


def test_a_restart_whose_counters_look_perfect_still_fails_on_different_losses(tmp_path):
    cold = [row(tmp_path, "cold-1", misses=2, compiles=2)]
    warm = [row(tmp_path, "warm-1", hits=2, loss_hex=["0x1.0p+0", "0x1.0p+0"])]
    result = restart.judge_restart(
        cold, warm, None, {"k": (1, 1)}, None, restart.RestartConfig(), None
    )
    assert any("differ from cold-1's" in reason for reason in result.reasons)


def test_same_numbers_needs_a_run_that_really_loaded(tmp_path):
    cold = row(tmp_path, "cold", misses=2, compiles=2)
    recompiled = row(tmp_path, "warm-same", misses=2, compiles=2)
    result = cachekeys.judge_same_numbers(cold, [recompiled], None, None)
    assert not result.passed
    assert "no warm run loaded" in result.reasons[0]


def _sharded(tmp_path, name, *, spec="{devices=[4]0,1,2,3}", out="00ff", misses=0, hits=0):
    facts = {"output_sharding_spec": spec, "output_hex": out, "output_correct": True}
    return row(tmp_path, name, misses=misses, hits=hits, report_extra=facts)


def test_a_sharded_output_must_keep_its_spec_and_bytes_after_a_hit(tmp_path):
    cold = row(tmp_path, "cold", misses=2, compiles=2)
    warm = row(tmp_path, "warm-same", hits=2)
    s_cold = _sharded(tmp_path, "sharded-cold", misses=1)
    good = _sharded(tmp_path, "sharded-warm", hits=1)
    assert cachekeys.judge_same_numbers(cold, [warm], s_cold, good).passed
    replicated = _sharded(tmp_path, "sharded-warm", hits=1, spec="{replicated}")
    result = cachekeys.judge_same_numbers(cold, [warm], s_cold, replicated)
    assert result.reasons == [
        "sharded-warm: output sharding spec '{replicated}' after the cache hit, "
        "'{devices=[4]0,1,2,3}' when compiled"
    ]
    other_bytes = _sharded(tmp_path, "sharded-warm", hits=1, out="0000")
    assert not cachekeys.judge_same_numbers(cold, [warm], s_cold, other_bytes).passed
    no_hit = _sharded(tmp_path, "sharded-warm", hits=0)
    reasons = cachekeys.judge_same_numbers(cold, [warm], s_cold, no_hit).reasons
    assert "not loaded from the cache" in reasons[0]


# --- cache key -----------------------------------------------------------------------------


def _variant(name: str) -> cachekeys.Variant:
    return next(v for v in cachekeys.variants(Path("/dump")) if v.name == name)


def test_key_safety_passes_when_the_cache_tells_settings_apart(tmp_path):
    cold = row(tmp_path, "cold", misses=2, compiles=2)
    runs = [
        (_variant("warm-same"), row(tmp_path, "warm-same", hits=2), None),
        (_variant("warm-dump"), row(tmp_path, "warm-dump", hits=2), None),
        (_variant("warm-fast-math"), row(tmp_path, "warm-fast-math", misses=2, compiles=2), None),
        (_variant("warm-custom-option"), None, "this build has no set_custom_compile_options"),
    ]
    result = cachekeys.judge_cache_key(cold, runs)
    assert result.passed, result.reasons
    statuses = {v["variant"]: v["status"] for v in result.figures["variants"]}
    assert statuses == {
        "warm-same": "pass",
        "warm-dump": "pass",
        "warm-fast-math": "pass",
        "warm-custom-option": "not applicable",
    }
    custom = result.figures["variants"][-1]
    assert custom["reason"] == "this build has no set_custom_compile_options"


def test_a_setting_that_shapes_the_executable_but_still_hits_fails(tmp_path):
    cold = row(tmp_path, "cold", misses=2, compiles=2)
    runs = [(_variant("warm-custom-option"), row(tmp_path, "warm-custom-option", hits=2), None)]
    result = cachekeys.judge_cache_key(cold, runs)
    assert not result.passed
    assert "the cache key ignores a setting that shapes the executable" in result.reasons[0]


def test_a_setting_that_must_not_matter_but_misses_fails(tmp_path):
    cold = row(tmp_path, "cold", misses=2, compiles=2)
    runs = [(_variant("warm-dump"), row(tmp_path, "warm-dump", misses=2, compiles=2), None)]
    result = cachekeys.judge_cache_key(cold, runs)
    assert not result.passed
    assert "must hit the cache but loaded 0 of 2" in result.reasons[0]


def test_variants_that_cannot_run_say_why():
    fast_math, custom = _variant("warm-fast-math"), _variant("warm-custom-option")
    assert cachekeys.not_applicable(fast_math, "CPU", {}) is None
    assert "XLA:CPU option" in str(cachekeys.not_applicable(fast_math, "TPU", {}))
    assert "no torch_xla.set_custom_compile_options" in str(
        cachekeys.not_applicable(custom, "CPU", {"has_set_custom_compile_options": False})
    )
    assert cachekeys.not_applicable(custom, "TPU", {"has_set_custom_compile_options": True}) is None


def test_the_restart_checks_cold_and_first_warm_run_stand_for_cold_and_warm_same(tmp_path):
    restart_rows = [
        row(tmp_path, "cold-1", misses=2, compiles=2),
        *(row(tmp_path, name, hits=2) for name in ("warm-1", "warm-2", "read-only")),
    ]
    kept = tmp_path / "kept-cold-cache"
    assert cachekeys.shared_runs(restart_rows, kept) is None  # no copy of the cold cache
    kept.mkdir()
    shared = cachekeys.shared_runs(restart_rows, kept)
    assert shared is not None
    assert (shared.cold["name"], shared.cold_cache) == ("cold-1", kept)
    assert shared.warm_same is not None and shared.warm_same["name"] == "warm-1"
    # A cold run that hung its first loader still gives the cache checks their cold run.
    assert cachekeys.shared_runs(restart_rows[:1], kept).warm_same is None


# --- upstream's test_persistent_cache.py ----------------------------------------------------

# Decorators in the shapes upstream uses (written here, not copied).
SKIPPING = """
@absltest.skipUnless(xr.device_type() in {'TPU', 'NEURON'},
                     'no cache here')
class T(parameterized.TestCase):
  @absltest.skipUnless(xr.device_type() == 'TPU', 'TPU only')
  def test_a(self):
    pass
  @absltest.skipUnless(other_condition, 'kept')
  def test_b(self):
    pass
"""


def test_lifting_the_device_skips_rewrites_only_their_conditions():
    lifted, count = upstream_tests.lift_device_skips(SKIPPING)
    assert count == 2
    assert "@absltest.skipUnless(True,\n                     'no cache here')" in lifted
    assert "@absltest.skipUnless(True, 'TPU only')" in lifted
    assert "@absltest.skipUnless(other_condition, 'kept')" in lifted
    assert "device_type" not in lifted


JUNIT = """<?xml version="1.0"?>
<testsuites><testsuite name="PersistentCacheTest">
<testcase name="test_persistent_cache_mp" status="run" result="completed">
  <failure message="AssertionError: Computation cache has already been initialized"/>
</testcase>
<testcase name="test_persistent_cache_single_device" status="run" result="completed"/>
<testcase name="test_persistent_cache_spmd_sharded" status="run" result="completed">
  <failure message="AssertionError: counter PersistentCacheHit: expected 1, got None"/>
</testcase>
<testcase name="test_replicated_spmd_hash" status="run" result="suppressed"/>
</testsuite></testsuites>
"""


def test_each_upstream_case_gets_its_verdict_and_mp_is_not_applicable_on_cpu():
    cases = upstream_tests.parse_junit(JUNIT)
    assert [c.outcome for c in cases] == ["failed", "passed", "failed", "skipped"]
    result = upstream_tests.judge_upstream(cases, "CPU", lifted=3, exit_code=1)
    statuses = {c["case"]: c["status"] for c in result.figures["cases"]}
    assert statuses["test_persistent_cache_mp"] == "not applicable"
    assert not result.passed
    assert result.reasons == [
        "test_persistent_cache_spmd_sharded: failed: AssertionError: "
        "counter PersistentCacheHit: expected 1, got None",
        "test_replicated_spmd_hash: skipped although the device skips were lifted",
    ]
    # On TPU the mp case applies and counts.
    tpu = upstream_tests.judge_upstream(cases[:1], "TPU", lifted=3, exit_code=1)
    assert not tpu.passed


def test_an_upstream_run_without_cases_fails():
    result = upstream_tests.judge_upstream([], "CPU", lifted=3, exit_code=2)
    assert result.reasons == ["the upstream test reported no cases (exit 2)"]
    passing = [CaseResult("test_persistent_cache_single_device", "passed")]
    assert upstream_tests.judge_upstream(passing, "CPU", lifted=3, exit_code=0).passed


def test_the_text_report_gives_each_variant_and_case_its_own_line(tmp_path):
    from xla_host.gate.report import render_text

    cold = row(tmp_path, "cold", misses=2, compiles=2)
    runs = [(_variant("warm-custom-option"), None, "no API")]
    key = cachekeys.judge_cache_key(cold, runs)
    cases = [CaseResult("test_persistent_cache_mp", "failed", "boom")]
    upstream = upstream_tests.judge_upstream(cases, "CPU", lifted=3, exit_code=1)
    text = render_text(None, [key, upstream])
    assert "  NOT APPLICABLE  warm-custom-option (" in text and "must miss): no API" in text
    assert "  NOT APPLICABLE  test_persistent_cache_mp (failed): on CPU, xmp.spawn" in text
    assert text.count("no API") == 1
