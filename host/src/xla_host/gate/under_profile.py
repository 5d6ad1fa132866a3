"""The gate under a bundle's launch profile (``make gate BUNDLE=… PROFILE=…``).

Every child of every check starts from the profile's environment instead of the caller's
shell: the profile's variables are set, and the variables torch_xla hashes into its cache
key (XLA_FLAGS, LIBTPU_INIT_ARGS, TPU_MEGACORE, XLA_HLO_DEBUG, XLA_IR_DEBUG) that the
profile does not set are removed, so a flag left in the shell cannot be judged in the
profile's name. Three kinds of setting are not taken as the profile says, and the run
names each (report, receipt, console):

- set by the gate: what a check must vary or control to measure anything. PJRT_DEVICE is
  the gate's device; the cache path and read-only switch are each check's own empty
  scratch cache (a check that measures cold and warm restarts cannot start from a
  fleet's cache); XLA_USE_SPMD is off for ``restart`` and on for ``spmd-restart``;
  XLA_NO_SPECIAL_SCALARS is 1 for every child (the recompilation canary's premise);
  CPU_NUM_DEVICES is set by the SPMD and sharded checks on CPU.
- inert on CPU: libtpu's settings (LIBTPU_INIT_ARGS, TPU_*): on a host without TPU chips
  torch_xla loads no libtpu (``_setup_default_env`` only touches LIBTPU_INIT_ARGS when
  chips are present), so they reach the children but change nothing they run. They are
  still in the children's environment, and LIBTPU_INIT_ARGS's ``--xla*`` tokens still
  enter the cache key (env_hash.cpp hashes the string on every device).
- everything else reaches the children as written: XLA_FLAGS above all, which XLA:CPU
  parses and which changes the cache key and the compiled program on CPU too.

Standard library only, like the whole gate.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from xla_host.launch_profile import CACHE_KEY_VARIABLES, CACHE_PATH, CACHE_READ_ONLY, LaunchProfile
from xla_host.redact import mask_environment

#: The settings a gate check controls itself, and why.
SET_BY_GATE: Mapping[str, str] = {
    "PJRT_DEVICE": "the gate's device",
    CACHE_PATH: "each check uses its own empty scratch cache",
    CACHE_READ_ONLY: "each check uses its own empty scratch cache",
    "XLA_USE_SPMD": "off for restart, on for spmd-restart",
    "XLA_NO_SPECIAL_SCALARS": "1 for every child (the recompilation canary's premise)",
    "CPU_NUM_DEVICES": "set by the SPMD and sharded checks on CPU",
}
#: libtpu's settings: read only where torch_xla loads libtpu (a host with TPU chips).
TPU_ONLY = frozenset(
    {
        "LIBTPU_INIT_ARGS",
        "TPU_MEGACORE",
        "TPU_VISIBLE_CHIPS",
        "TPU_PROCESS_BOUNDS",
        "TPU_CHIPS_PER_PROCESS_BOUNDS",
        "TPU_PROCESS_PORT",
    }
)


@dataclass(frozen=True)
class GateProfile:
    """A profile as one gate run applies it."""

    name: str
    sha256: str
    environment: Mapping[str, str]
    """What the children get from the profile (role writer: the gate owns its caches)."""
    set_by_gate: Mapping[str, str] = field(default_factory=dict)
    inert: Mapping[str, str] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The receipt's ``profile`` object, its environment masked as every record's
        (:func:`xla_host.redact.mask_environment`)."""
        return {
            "name": self.name,
            "sha256": self.sha256,
            "environment": mask_environment(self.environment),
            "set-by-gate": dict(self.set_by_gate),
            "inert": dict(self.inert),
        }

    def lines(self) -> list[str]:
        lines = [f"launch profile {self.name} (sha256 {self.sha256[:12]})"]
        lines += [f"  set by the gate: {k} ({why})" for k, why in sorted(self.set_by_gate.items())]
        lines += [f"  inert here: {k} ({why})" for k, why in sorted(self.inert.items())]
        return lines


def plan(profile: LaunchProfile, bundle: str, device: str) -> GateProfile:
    environment = profile.environment(bundle, "writer")
    set_by_gate = {k: why for k, why in SET_BY_GATE.items() if k in environment}
    inert = (
        {k: "no libtpu on CPU" for k in sorted(environment) if k in TPU_ONLY}
        if device == "CPU"
        else {}
    )
    return GateProfile(profile.name, profile.sha256, environment, set_by_gate, inert)


@contextmanager
def children_launched_under(gate_profile: GateProfile | None) -> Iterator[None]:
    """The gate process's environment, which every child inherits, set to the profile's
    for the duration of a run (and restored after: the CLI may run in-process in tests)."""
    if gate_profile is None:
        yield
        return
    saved = dict(os.environ)
    try:
        for variable in CACHE_KEY_VARIABLES:
            if variable not in gate_profile.environment:
                os.environ.pop(variable, None)
        os.environ.update(gate_profile.environment)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
