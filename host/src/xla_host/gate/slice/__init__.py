"""A multi-host slice: the workers of one gate run and their barrier.

``xla-host gate`` started on every worker of a slice (``gcloud compute tpus tpu-vm ssh
--worker=all``) forms one run. Worker 0 is the only writer of the shared cache directory;
every other worker is a reader (``XLA_PERSISTENT_CACHE_READ_ONLY=1``). The workers start
every phase that starts processes (cold, each warm run, read-only) together through a
barrier on a board they all see: a directory on a shared mount (``--slice-dir``,
``directory``), or worker 0's address (``--coordinator host:port``, ``coordinator``:
worker 0 keeps the same board in memory and serves it over TCP):

* a worker arrives at a phase by posting its arrival, with whether it is still fit to go
  on; a post that did not reach the board raises (it does not count as posted);
* it then polls until every worker has arrived, or a worker reports that it failed, or
  a missing worker is dead (its heartbeat stopped changing for ``dead_after_s``, measured
  on the waiter's own clock, so clock skew between hosts does not matter; with a
  coordinator, worker 0 is dead once the coordinator stopped answering that long), or the
  phase's deadline (``timeout_s``) passed; the error names the missing worker(s).

Why not torch_xla's own multi-process runtime: on TPU, libtpu forms a multi-host runtime
from the slice's metadata, but on CPU torch_xla cannot join processes of several hosts
into one runtime the way libtpu does, so a barrier that depended on it could never run
here. The barrier runs the same everywhere (this machine's tests, a TPU slice) and needs
nothing but a shared directory or a port on worker 0 the others can reach. What this
machine cannot show: libtpu's multi-host runtime itself, under the workers.

One module per concern: ``spec`` (the slice from the options or the environment),
``barrier`` (the pure verdict), ``directory`` and ``coordinator`` (the transports; the
latter says why not torch's TCPStore), ``membership`` (heartbeats, join, abort, finish),
``merge`` (what worker 0 records). The writer lease of the cache directory is
``xla_host.slice``. Standard library only, like the whole host side.
"""

from __future__ import annotations

from xla_host.gate.slice.barrier import Arrival, BarrierVerdict, BeatSeen, judge_barrier
from xla_host.gate.slice.coordinator import CoordinatorBoard
from xla_host.gate.slice.directory import DirectoryBoard
from xla_host.gate.slice.membership import Board, Slice, running
from xla_host.gate.slice.merge import merge_slice, slice_verdicts, topology
from xla_host.gate.slice.spec import (
    BEAT_S,
    DEAD_AFTER_S,
    JOIN_TIMEOUT_S,
    POLL_S,
    WRITER,
    SliceError,
    SliceSpec,
    SliceTimeout,
    SliceWorkerFailed,
    slice_spec,
)

__all__ = [
    "BEAT_S",
    "DEAD_AFTER_S",
    "JOIN_TIMEOUT_S",
    "POLL_S",
    "WRITER",
    "Arrival",
    "BarrierVerdict",
    "BeatSeen",
    "Board",
    "CoordinatorBoard",
    "DirectoryBoard",
    "Slice",
    "SliceError",
    "SliceSpec",
    "SliceTimeout",
    "SliceWorkerFailed",
    "judge_barrier",
    "merge_slice",
    "running",
    "slice_spec",
    "slice_verdicts",
    "topology",
]
