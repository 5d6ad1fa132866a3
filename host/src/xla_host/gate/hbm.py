"""The HBM-query check: under SPMD, ask every physical device for its memory.

Every device this process addresses: on a multi-host slice each worker asks its own
host's chips (``_xla_get_runtime_devices``), never another host's, which no process but
that host's can reach; worker 0's receipt merges the workers' verdicts (``xla_host.gate.slice``).

Stock torch_xla can only ask the virtual ``SPMD:0`` device, which the runtime rejects.
Patch 0002 adds ``torch_xla._XLAC._xla_runtime_memory_info(device_str)`` taking a raw
runtime device string. One child (``--mode hbm``) enables SPMD, enumerates the runtime
devices and queries each; ``judge_hbm`` decides from its report. When the SPMD restart
check runs too, its first cold run makes the same queries after its steps instead
(``judge_shared_run``), and no child of its own is started:

* TPU: every device answers with a positive, plausible ``bytes_limit`` for the chip, and
  ``bytes_used`` rises by about the size of a tensor replicated onto every device.
* CPU (no HBM, no allocator statistics): the binding exists and reaches the runtime,
  which shows as the allocator-statistics error (GetAllocatorStats), not a device-parsing
  or SPMD virtual-device error. An unknown device is refused with the valid ones listed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from xla_host import log
from xla_host.gate import restart
from xla_host.gate.check import Declared, GateRun, figure_row, verdict_row
from xla_host.gate.child_workload import DEFAULT_PROBE_BYTES
from xla_host.gate.children import run_child, runtime_env
from xla_host.gate.result import CheckResult, failed
from xla_host.gate.target import Target

NAME = "hbm"
PATCH = "patches/torch_xla/0002-runtime-memory-info-binding.patch"
GIB = 1024**3
#: HBM per chip by TPU generation (torch_xla.tpu.version()); v6e (Trillium) has 32 GiB.
#: The runtime reserves some HBM, so a plausible bytes_limit lies between half the chip's
#: HBM and all of it. torch_xla reports 5 for both v5e (16 GiB) and v5p (95 GiB).
HBM_PER_CHIP = {4: 32 * GIB, 5: 95 * GIB, 6: 32 * GIB}
HBM_FLOOR = {4: 16 * GIB, 5: 8 * GIB, 6: 16 * GIB}
#: On CPU, four devices make the enumeration meaningful (CPU:0..CPU:3).
CPU_DEVICES = 4
PROBE_BYTES = DEFAULT_PROBE_BYTES

_ALLOCATOR_MARKERS = ("getallocatorstats", "allocator stat")
_WRONG_ROUTE_MARKERS = ("spmd virtual device", "spmd:0", "invalid device", "parse")


def _mentions(text: str, markers: tuple[str, ...]) -> bool:
    return any(marker in text.lower() for marker in markers)


def judge_hbm(report: dict[str, Any] | None, failure: str | None, target: Target) -> CheckResult:
    if report is None or not report.get("ok"):
        return failed(NAME, f"the HBM queries did not finish: {failure}")
    devices: list[str] = list(report.get("runtime_devices", []))
    figures: dict[str, Any] = {
        # The devices this worker addresses (on a multi-host slice: its host's chips only).
        "runtime_devices": devices,
        "global_device_count": report.get("global_device_count"),
        "stock_memory_info_under_spmd": report.get("stock_memory_info_under_spmd"),
    }
    if not report.get("has_binding"):
        return failed(
            NAME,
            "torch_xla._XLAC._xla_runtime_memory_info is missing: this build lacks " f"{PATCH}",
            **figures,
        )
    if not devices:
        return failed(NAME, "no physical runtime devices were enumerated under SPMD", **figures)
    reasons: list[str] = []
    unknown = report.get("unknown_device", {})
    if unknown.get("ok"):
        reasons.append("an unknown device string was accepted instead of refused")
    elif devices[0] not in str(unknown.get("error", "")):
        reasons.append(
            "the error for an unknown device does not list the valid devices: "
            f"{unknown.get('error')}"
        )
    judge = _judge_tpu if target.device == "TPU" else _judge_without_hbm
    device_reasons, device_figures, passing_note = judge(report, devices, target)
    reasons += device_reasons
    figures.update(device_figures)
    notes = [] if reasons else [passing_note]
    return CheckResult(NAME, not reasons, reasons, notes, figures)


def _judge_tpu(
    report: dict[str, Any], devices: list[str], target: Target
) -> tuple[list[str], dict[str, Any], str]:
    """Each chip's HBM: a plausible limit for its generation, and usage that tracks the
    probe tensor. Returns the reasons, the figures and the note when all is well."""
    ceiling = HBM_PER_CHIP.get(target.tpu_version or 0, 128 * GIB)
    floor = HBM_FLOOR.get(target.tpu_version or 0, 1 * GIB)
    before: dict[str, dict[str, Any]] = report.get("before", {})
    after: dict[str, dict[str, Any]] = report.get("after", {})
    probe = int(report.get("probe_bytes", 0))
    reasons: list[str] = []
    deltas: dict[str, int] = {}
    for device in devices:
        entry = before.get(device, {})
        if not entry.get("ok"):
            reasons.append(f"{device}: query failed: {entry.get('error')}")
            continue
        limit = int(entry["info"].get("bytes_limit", 0))
        if not floor <= limit <= ceiling:
            reasons.append(
                f"{device}: bytes_limit {limit / GIB:.2f} GiB is implausible for this chip "
                f"(expected {floor / GIB:.0f}-{ceiling / GIB:.0f} GiB)"
            )
        later = after.get(device, {})
        if not later.get("ok"):
            reasons.append(f"{device}: query after placing a tensor failed: {later.get('error')}")
            continue
        delta = int(later["info"]["bytes_used"]) - int(entry["info"]["bytes_used"])
        deltas[device] = delta
        if not 0.9 * probe <= delta <= 2 * probe:
            reasons.append(
                f"{device}: bytes_used rose by {delta} bytes after placing a {probe}-byte tensor"
            )
    figures = {"probe_bytes": probe, "bytes_used_delta": deltas, "hbm_per_chip": ceiling}
    note = f"{len(devices)} chip(s) report plausible HBM and track a {probe}-byte tensor"
    return reasons, figures, note


def _judge_without_hbm(
    report: dict[str, Any], devices: list[str], target: Target
) -> tuple[list[str], dict[str, Any], str]:
    """No HBM, no allocator statistics: the binding must reach the runtime, which says so.
    Returns the reasons, the figures and the note when all is well."""
    before: dict[str, dict[str, Any]] = report.get("before", {})
    reasons: list[str] = []
    for device in devices:
        entry = before.get(device, {})
        if entry.get("ok"):
            info = entry.get("info", {})
            if int(info.get("bytes_limit", 0)) <= 0:
                reasons.append(f"{device}: answered without a positive bytes_limit: {info}")
            continue
        error = str(entry.get("error", "no answer"))
        if _mentions(error, _WRONG_ROUTE_MARKERS) or not _mentions(error, _ALLOCATOR_MARKERS):
            reasons.append(
                f"{device}: the query did not reach the runtime's allocator statistics: {error}"
            )
    figures = {"errors": {d: before.get(d, {}).get("error") for d in devices}}
    note = (
        f"{len(devices)} device(s) routed to the runtime, which has no allocator statistics "
        "on this platform (expected without HBM)"
    )
    return reasons, figures, note


def judge_shared_run(spmd_restart: CheckResult, target: Target) -> CheckResult:
    """The check from the SPMD restart check's first cold run, which made the queries after
    its steps (``RestartConfig.hbm_probe_bytes``): the same SPMD runtime on the same
    devices as this check's own child, one torch_xla import fewer."""
    began = time.monotonic()
    row = next((r for r in spmd_restart.runs if r["name"] == "cold-1"), None)
    if row is None or "hbm" not in row:
        failure = row.get("error") if row else None
        result = failed(NAME, f"the SPMD cold run that makes the queries did not finish: {failure}")
    else:
        report = row["hbm"]
        result = judge_hbm(report, report.get("error"), target)
    if row is not None:
        shared = {k: v for k, v in row.items() if k != "hbm"}
        result.runs = [{**shared, "same_run_as": f"{spmd_restart.name}: cold-1"}]
    result.duration_s = time.monotonic() - began
    return result


def run_hbm_check(target: Target, runs_dir: Path, *, timeout_s: float = 600.0) -> CheckResult:
    began = time.monotonic()
    env = runtime_env(target.device, cpu_devices=CPU_DEVICES)
    with log.section(f"hbm: query physical devices under SPMD on {target.device}"):
        child = run_child(
            target.python,
            "hbm",
            runs_dir / "hbm",
            ["--mode", "hbm", "--probe-bytes", str(PROBE_BYTES)],
            env,
            timeout_s,
        )
    result = judge_hbm(child.report, None if child.ok else child.failure(), target)
    result.runs = [child.row()]
    result.duration_s = time.monotonic() - began
    return result


# --- as the gate's registry lists it (xla_host.gate.checks) -----------------------------


def _judge_alone(run: GateRun, names: tuple[str, ...]) -> list[CheckResult]:
    return [run_hbm_check(run.target, run.runs_dir, timeout_s=run.timeout_s)]


def _judge_from_spmd(run: GateRun, names: tuple[str, ...], spmd: CheckResult) -> list[CheckResult]:
    return [judge_shared_run(spmd, run.target)]


#: The queries need an SPMD runtime on every device: with the SPMD restart check, its
#: first cold run makes them after its steps, one child fewer.
CHECK = Declared(
    names=(NAME,),
    child_runs=("hbm",),
    judge=_judge_alone,
    shares=restart.SPMD_NAME,
    judge_from=_judge_from_spmd,
    compare_rows=(
        verdict_row("hbm", NAME),
        figure_row("HBM per chip", NAME, "hbm_per_chip"),
        figure_row("HBM used delta", NAME, "bytes_used_delta"),
    ),
)
