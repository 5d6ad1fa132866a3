"""The environment under test: which interpreter, which device, and whether it works.

Before any check runs, one probe child imports torch_xla and brings the runtime up with
the requested device. Anything that makes the gate unable to judge (no such file, a
torch_xla import that raises, a device that is not there, a probe that hangs) becomes a
:class:`GateEnvironmentError` (exit 2) naming what to fix, never a traceback.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_host.gate import workload as workloads
from xla_host.gate.children import ChildResult, run_child, runtime_env
from xla_host.gate.errors import GateEnvironmentError

DEVICES = ("CPU", "TPU")


@dataclass(frozen=True)
class Target:
    python: Path
    device: str
    torch_version: str
    torch_xla_version: str
    runtime_devices: tuple[str, ...]
    has_runtime_memory_info: bool
    tpu_version: int | None
    workload: Mapping[str, Any] | None = None
    """The workload as the probe loaded it: name, reference, source, sha256, params
    (None: the probe was given no workload)."""
    accelerator_type: str | None = None
    """The TPU slice's type (``v6e-32``) from the TPU environment (metadata server or
    TPU_ACCELERATOR_TYPE) as torch_xla reads it; None off TPU or when unreadable."""

    @property
    def label(self) -> str:
        return f"torch_xla {self.torch_xla_version} (torch {self.torch_version}) on {self.device}"


def tpu_present(dev: Path = Path("/dev")) -> bool:
    """Whether this host exposes TPU chips (``/dev/accel*`` on v4/v5, VFIO groups on v6e)."""
    if any(dev.glob("accel[0-9]*")):
        return True
    vfio = dev / "vfio"
    return vfio.is_dir() and any(p.name.isdigit() for p in vfio.iterdir())


def default_device() -> str:
    return "TPU" if tpu_present() else "CPU"


def _explain_probe_failure(result: ChildResult, python: Path, device: str) -> GateEnvironmentError:
    error = (result.report or {}).get("error", "")
    if result.timed_out:
        return GateEnvironmentError(
            f"probing {python} with PJRT_DEVICE={device} hung: {result.failure()}",
            fix=f"check the {device} runtime; the probe log is {result.log_path}",
        )
    report = result.report or {}
    if report and "torch_xla_version" not in report:
        return GateEnvironmentError(
            f"torch_xla does not import in {python}: {error}",
            fix="pass PYTHON=<interpreter of an environment with torch and torch_xla installed>",
        )
    if report:
        return GateEnvironmentError(
            f"device {device} is not available to torch_xla {report.get('torch_xla_version')} "
            f"in {python}: {error}",
            fix="run on a TPU VM with libtpu installed, or use GATE_DEVICE=CPU"
            if device == "TPU"
            else "check the torch_xla installation; the probe log has details",
        )
    return GateEnvironmentError(
        f"the probe child of {python} failed: {result.failure()}\n{result.log_tail(10)}",
        fix="check that PYTHON is a working interpreter with torch_xla installed",
    )


def resolve_target(
    python: Path,
    device: str | None,
    *,
    workdir: Path,
    timeout_s: float = 300.0,
    workload: workloads.WorkloadSpec | None = None,
) -> Target:
    """Probe ``python`` on ``device``; given a ``workload``, the probe also loads it and
    calls its factory once, so one that cannot be judged is refused before any check."""
    if not python.exists() or not os.access(python, os.X_OK):
        raise GateEnvironmentError(
            f"{python} is not an executable interpreter",
            fix="pass PYTHON=<path to the python of a torch_xla environment>",
        )
    chosen = device or default_device()
    if chosen == "TPU" and not tpu_present():
        # Asking libtpu for chips on a host without any can take minutes to give up.
        raise GateEnvironmentError(
            "GATE_DEVICE=TPU but this host has no TPU chips (no /dev/accel*, no /dev/vfio groups)",
            fix="run on a Cloud TPU VM, or use GATE_DEVICE=CPU",
        )
    result = run_child(
        python,
        f"probe-{chosen.lower()}",
        workdir,
        ["--mode", "probe", *(workload.child_args() if workload else ())],
        runtime_env(chosen),
        timeout_s,
    )
    if not result.ok:
        raise _explain_probe_failure(result, python, chosen)
    report = result.report or {}
    if workload is not None and report.get("workload_problem"):
        raise workloads.unjudgeable(workload.name, report["workload_problem"], result.log_path)
    return Target(
        python=python,
        device=chosen,
        torch_version=str(report.get("torch_version")),
        torch_xla_version=str(report.get("torch_xla_version")),
        runtime_devices=tuple(report.get("runtime_devices", ())),
        has_runtime_memory_info=bool(report.get("has_runtime_memory_info")),
        tpu_version=report.get("tpu_version"),
        workload=report.get("workload"),
        accelerator_type=report.get("accelerator_type"),
    )
