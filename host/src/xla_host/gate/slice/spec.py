"""Which worker this is, of how many, where they meet, and how long they wait: the slice
from the options or the TPU VM's environment (``TPU_WORKER_ID``, ``TPU_WORKER_HOSTNAMES``,
``TPU_ACCELERATOR_TYPE``), and the errors that end a slice."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from xla_host.errors import CheckFailed, UsageError
from xla_host.slice import SliceError, SliceTimeout

__all__ = ["SliceError", "SliceSpec", "SliceTimeout", "SliceWorkerFailed", "slice_spec"]

#: The writer's role: the one worker that writes the shared cache directory.
WRITER = 0
#: How often a worker's heartbeat is refreshed.
BEAT_S = 1.0
#: A worker whose heartbeat did not change for this long is dead (seconds); the same bound
#: for a coordinator that stopped answering.
DEAD_AFTER_S = 10.0
#: A phase's deadline for workers that never showed a heartbeat (gcloud starts workers
#: one after the other; each imports torch first).
JOIN_TIMEOUT_S = 600.0
#: How often a waiting worker looks at the board: a phase starts at most this long after
#: its last arrival, on every worker (the barrier's cost; measured in tests/test_slice.py).
POLL_S = 0.2


class SliceWorkerFailed(SliceError, CheckFailed):
    """Another worker reported that it cannot go on: exit 1."""


@dataclass(frozen=True)
class SliceSpec:
    """Which worker this is, of how many, and where they meet."""

    worker_id: int
    workers: int
    directory: Path | None
    """The shared barrier directory (None only for a slice of one worker)."""
    accelerator_type: str | None = None
    """``v6e-32`` style, from ``TPU_ACCELERATOR_TYPE`` where the TPU VM sets it."""
    timeout_s: float = JOIN_TIMEOUT_S
    dead_after_s: float = DEAD_AFTER_S
    coordinator: tuple[str, int] | None = None
    """``--coordinator host:port``: worker 0 serves the board there instead of a directory."""

    @property
    def role(self) -> str:
        return "writer" if self.worker_id == WRITER else "reader"

    @property
    def writer(self) -> bool:
        return self.worker_id == WRITER


def slice_spec(
    worker_id: int | None,
    workers: int | None,
    directory: Path | None,
    env: Mapping[str, str],
    *,
    timeout_s: float = JOIN_TIMEOUT_S,
    coordinator: str | None = None,
) -> SliceSpec | None:
    """The slice from the options, else from the TPU VM's environment (``TPU_WORKER_ID``,
    ``TPU_WORKER_HOSTNAMES``); None when neither names one (one host, no slice)."""
    hostnames = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if worker_id is None and env.get("TPU_WORKER_ID", "").strip():
        try:
            worker_id = int(env["TPU_WORKER_ID"])
        except ValueError:
            raise UsageError(
                f"TPU_WORKER_ID={env['TPU_WORKER_ID']!r} is not a worker number",
                fix="pass --worker-id N explicitly",
            ) from None
    if workers is None and hostnames:
        workers = len(hostnames)
    if workers is None and worker_id == 0 and directory is None:
        workers = 1  # TPU_WORKER_ID=0 without a host list: a one-host slice
    if worker_id is None and workers is None and directory is None and coordinator is None:
        return None
    if worker_id is None or workers is None:
        raise UsageError(
            "a slice needs this worker's number and the number of workers",
            fix="pass --worker-id N --workers M (on a TPU VM TPU_WORKER_ID and "
            "TPU_WORKER_HOSTNAMES give them)",
        )
    if workers < 1 or not 0 <= worker_id < workers:
        raise UsageError(
            f"worker {worker_id} is not one of {workers} worker(s) (0 to {workers - 1})",
            fix="number the workers 0 to M-1 with --worker-id, and --workers M",
        )
    if workers > 1 and (directory is None) == (coordinator is None):
        raise UsageError(
            f"a slice of {workers} workers needs one place where they meet: a directory "
            "every worker sees, or worker 0's address",
            fix="pass --slice-dir DIR on a shared mount (a fresh one per run), or "
            "--coordinator <worker 0's host>:<port>, to every worker",
        )
    accelerator = env.get("TPU_ACCELERATOR_TYPE", "").strip() or None
    address = _address(coordinator) if coordinator is not None else None
    return SliceSpec(worker_id, workers, directory, accelerator, timeout_s, coordinator=address)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"--coordinator {text!r} is not host:port",
            fix="pass --coordinator <worker 0's host or address>:<port>, e.g. t1v-n-0:8476",
        )
    return host.strip("[]"), int(port)
