"""Running ``child_workload.py`` in fresh processes of the environment under test.

Each child gets its own process group, a timeout, and a JSON report file; its stdout and
stderr (torch and XLA logs) go to a log file next to the report, kept as evidence. On a
timeout the whole process group is terminated, then killed, so a hung compile or a
grandchild never outlives the gate.

A child may also be watched for a stall (``stall_s``): on the CPU device every step is
computed by the child's own threads, so a child that used no CPU time for that long is
waiting for something that will not come (stock 2.7.0's SPMD warm run blocks in XLA's
collective rendezvous, every thread in a futex wait). It is then handled as a timeout at
once instead of at the end of its time bound, which on that control was 60 s sooner.

No child outlives the gate, however either ends (:mod:`xla_host.lineage`): each is started
with the parent-death signal (SIGKILL when the gate is killed), the gate is a child
subreaper, and when a run ends every process still carrying that run's marker
(:data:`RUN_MARKER` in its environment) under the gate is ended too: a workload's
processes in sessions of their own, which the group kill misses.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from xla_host import lineage, log
from xla_host.filemode import NotARegularFile, read_shared
from xla_host.gate.stacks import capture_native_stacks, summarize_stacks
from xla_host.redact import mask_environment

CHILD_SCRIPT = Path(__file__).with_name("child_workload.py")
#: Seconds between SIGTERM and SIGKILL to a timed-out process group.
KILL_GRACE_S = 5.0
#: A watched child is stalled when it used less than this share of one core over the last
#: ``stall_s`` seconds. Not zero: a blocked process still wakes now and then (a logging
#: thread, a timed wait that rearms). Far below what the busiest machine leaves a runnable
#: process: ten runnable processes on two cores still give each 20 %.
STALL_CPU_SHARE = 0.01
#: How often a watched child's CPU time is read.
_POLL_S = 1.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: The variable each child starts with, ``<gate pid>.<run number>``, inherited by whatever it
#: starts: what finds a run's processes once they left its group and its PPid chain.
RUN_MARKER = "XLA_HOST_GATE_RUN"
_RUN_NUMBERS = itertools.count(1)


class ChildrenStopped(Exception):
    """Raised by ``start_child`` once ``stop_all`` ran: the gate is being interrupted."""


#: The children running now, across the gate's threads (``run_in_parallel``), and whether
#: ``stop_all`` ran. Module state on purpose (with each run's marker, ``_MARKERS``): a Ctrl-C
#: reaches the main thread alone, and each child runs in a session of its own, so the
#: signal reaches no child either. ``stop_all`` must find every child that any thread started.
_LOCK = threading.Lock()
_RUNNING: set[subprocess.Popen[bytes]] = set()
_STOPPING = threading.Event()
#: Each started child's marker value (:data:`RUN_MARKER`), until its run has ended.
_MARKERS: dict[int, str] = {}


def stop_all() -> None:
    """Kill every running child's process group; no further child starts."""
    with _LOCK:
        _STOPPING.set()
        running = list(_RUNNING)
    for process in running:
        kill_group(process)


@dataclass
class ChildResult:
    """What one child process did: its report, or why there is none."""

    name: str
    returncode: int | None
    wall_s: float
    report: dict[str, Any] | None
    log_path: Path
    timed_out: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.report is not None and bool(self.report.get("ok"))

    def failure(self) -> str:
        """One line saying why this child produced no usable report."""
        phase = self.extra.get("phase")
        where = f" in {phase}" if phase else ""
        if "stalled_s" in self.extra:
            return (
                f"{self.name}: used no CPU time for {self.extra['stalled_s']:.0f}s{where}, "
                f"killed after {self.wall_s:.0f}s (process group killed)"
            )
        if self.timed_out:
            return f"{self.name}: timed out after {self.wall_s:.0f}s{where} (process group killed)"
        if self.report is not None and not self.report.get("ok"):
            return f"{self.name}: {self.report.get('error', 'failed')}"
        if self.returncode is not None and self.returncode < 0:
            return f"{self.name}: killed by signal {-self.returncode} (log: {self.log_path})"
        return f"{self.name}: exited {self.returncode} without a report (log: {self.log_path})"

    def row(self) -> dict[str, Any]:
        """Its line among a check's runs in the report."""
        return {
            "name": self.name,
            "ok": self.ok,
            "wall_s": round(self.wall_s, 3),
            "log": str(self.log_path),
        }

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """End ``process`` and its process group: SIGTERM, then SIGKILL to what outlived it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=KILL_GRACE_S)
            # The leader is gone; members of the group may still run: finish them too.
            os.killpg(process.pid, signal.SIGKILL)
        except subprocess.TimeoutExpired:
            continue  # the leader still runs: the next signal
        except ProcessLookupError:
            pass  # the whole group is gone
        return


def end_leftovers(process: subprocess.Popen[bytes]) -> None:
    """End what the run of ``process`` left running, whatever its session or group (its
    marker's processes under the gate, :func:`xla_host.lineage.end_marked`)."""
    with _LOCK:
        marker = _MARKERS.pop(process.pid, None)
    if marker is not None:
        lineage.end_marked(RUN_MARKER, marker, KILL_GRACE_S)


def start_child(
    python: Path | str,
    name: str,
    workdir: Path,
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    script: Path = CHILD_SCRIPT,
) -> tuple[subprocess.Popen[bytes], Path, Path, float]:
    """Start a child without waiting; ``finish_child`` collects it.

    ``script`` is another child program of this directory with the same contract
    (``--out`` JSON report, standard library, torch and torch_xla only).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / f"{name}.json"
    log_path = workdir / f"{name}.log"
    out.unlink(missing_ok=True)
    argv = [str(python), str(script), "--out", str(out), *args]
    # Printed: only what the child's environment adds to the inherited one.
    policy = {k: v for k, v in env.items() if k not in os.environ or os.environ[k] != v}
    log.command(argv, env=policy)
    # Orphans of the run's processes come back to the gate, where end_leftovers finds them.
    lineage.become_subreaper()
    marker = f"{os.getpid()}.{next(_RUN_NUMBERS)}"
    with _LOCK, open(log_path, "wb") as log_file:
        if _STOPPING.is_set():
            raise ChildrenStopped(name)
        process = lineage.popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**env, RUN_MARKER: marker},
            start_new_session=True,  # its own process group, killed as one on timeout
        )
        _RUNNING.add(process)
        _MARKERS[process.pid] = marker
    return process, out, log_path, time.monotonic()


#: The child's phase file beside its report (gate/child_workload.py writes it).
PHASE_SUFFIX = ".phase"


def _phase_of(path: Path) -> str | None:
    """What a killed child last said it was doing; None when it said nothing."""
    try:
        text = read_shared(path, what="phase file", limit=4096).decode(errors="replace")
    except (OSError, NotARegularFile):
        return None
    return text.strip() or None


def in_workload_code(phase: str | None) -> bool:
    """The phase is the workload's own code (its module or factory), not the runtime's."""
    return phase is not None and phase.startswith(("the workload's", "loading the workload"))


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, every thread) a live process has used; None when unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the command name: state is field 3 of stat(5), utime 14 and stime 15.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _wait(
    process: subprocess.Popen[bytes], began: float, timeout_s: float, stall_s: float | None
) -> float | None:
    """Wait for the child's end. Raise ``TimeoutExpired`` past ``timeout_s``; return the
    window when it stalled first (see the module doc), else None."""
    deadline = began + timeout_s
    samples: list[tuple[float, float]] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise subprocess.TimeoutExpired(process.args, timeout_s)
        try:
            process.wait(timeout=min(remaining, _POLL_S) if stall_s else remaining)
            return None
        except subprocess.TimeoutExpired:
            if stall_s is None:
                continue
        now, used = time.monotonic(), cpu_seconds(process.pid)
        if used is None:
            continue
        samples.append((now, used))
        old = [sample for sample in samples if sample[0] <= now - stall_s]
        if old:
            then, used_then = old[-1]
            if used - used_then < STALL_CPU_SHARE * (now - then):
                return now - then
            samples = samples[len(old) - 1 :]


def finish_child(
    started: tuple[subprocess.Popen[bytes], Path, Path, float],
    name: str,
    timeout_s: float,
    *,
    stacks_on_timeout: bool = False,
    stall_s: float | None = None,
) -> ChildResult:
    """Wait for a child; on timeout or a stall (``stall_s``; optionally after taking its
    native stacks) kill it."""
    process, out, log_path, began = started
    timed_out = False
    extra: dict[str, Any] = {}
    # A previous child's phase must not be read as this one's.
    phase_file = out.with_name(out.name + PHASE_SUFFIX)
    phase_file.unlink(missing_ok=True)
    try:
        stalled = _wait(process, began, timeout_s, stall_s)
        if stalled is not None:
            extra["stalled_s"] = round(stalled, 1)
            raise subprocess.TimeoutExpired(process.args, timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        if stacks_on_timeout:
            # Taken while the child still hangs: after the kill there is nothing to see.
            extra["hung_after_s"] = round(time.monotonic() - began, 1)
            capture = capture_native_stacks(process.pid, log_path.with_suffix(".stacks.txt"))
            if capture.path is not None:
                text = capture.path.read_text(errors="replace")
                extra["stacks"] = str(capture.path)
                extra["stacks_summary"] = summarize_stacks(text)
                # In report.json itself too: the report is what CI keeps.
                extra["native_stacks"] = text
            if capture.error is not None:
                extra["stacks_error"] = capture.error
        kill_group(process)
        if (phase := _phase_of(phase_file)) is not None:
            extra["phase"] = phase
    except BaseException:
        # Interrupted (Ctrl-C): the child is in its own session and did not get the
        # signal, so it must not outlive the gate.
        kill_group(process)
        raise
    finally:
        with _LOCK:
            _RUNNING.discard(process)
        phase_file.unlink(missing_ok=True)  # read above when it mattered
        wall = time.monotonic() - began  # the child's time, not the clean-up's below
        end_leftovers(process)
    report: dict[str, Any] | None = None
    if not timed_out:
        try:
            loaded = json.loads(out.read_text())
            report = loaded if isinstance(loaded, dict) else None
        except (OSError, ValueError):
            report = None
    return ChildResult(
        name=name,
        returncode=process.returncode,
        wall_s=wall,
        report=report,
        log_path=log_path,
        timed_out=timed_out,
        extra=extra,
    )


def run_child(
    python: Path | str,
    name: str,
    workdir: Path,
    args: Sequence[str],
    env: Mapping[str, str],
    timeout_s: float,
    *,
    stacks_on_timeout: bool = False,
    stall_s: float | None = None,
    script: Path = CHILD_SCRIPT,
) -> ChildResult:
    return finish_child(
        start_child(python, name, workdir, args, env, script=script),
        name,
        timeout_s,
        stacks_on_timeout=stacks_on_timeout,
        stall_s=stall_s,
    )


@dataclass(frozen=True)
class ChildSpec:
    """One child to run beside others (``run_side_by_side``)."""

    name: str
    args: Sequence[str]
    env: Mapping[str, str]
    script: Path = CHILD_SCRIPT


def run_side_by_side(
    python: Path | str,
    workdir: Path,
    specs: Sequence[ChildSpec],
    timeout_s: float,
    *,
    device: str,
) -> list[ChildResult]:
    """Start every child, then collect each: for runs judged by counters and outputs only,
    which a neighbour process does not change (never for a timing the gate judges).

    Only on CPU: a process that opens a TPU holds its chips, so there they run one after
    the other. Should collecting one be interrupted, the others' process groups are killed.
    """
    if device != "CPU":
        return [
            run_child(python, s.name, workdir, s.args, s.env, timeout_s, script=s.script)
            for s in specs
        ]
    started = [
        start_child(python, spec.name, workdir, spec.args, spec.env, script=spec.script)
        for spec in specs
    ]
    results: list[ChildResult] = []
    try:
        for spec, handle in zip(specs, started, strict=True):
            results.append(finish_child(handle, spec.name, timeout_s))
    except BaseException:
        for handle in started[len(results) :]:
            kill_group(handle[0])
            end_leftovers(handle[0])
        raise
    return results


def runtime_env(
    device: str,
    *,
    cache_dir: Path | None = None,
    read_only: bool = False,
    cpu_devices: int | None = None,
) -> dict[str, str]:
    """The users' runtime policy, set before the child imports torch_xla."""
    # A child process inherits this environment (PATH, proxies, TMPDIR): not a setting.
    env = dict(os.environ)
    # Flags inherited from the caller's shell must not change what is measured.
    for key in ("XLA_PERSISTENT_CACHE_PATH", "XLA_PERSISTENT_CACHE_READ_ONLY", "XLA_USE_SPMD"):
        env.pop(key, None)
    env["PJRT_DEVICE"] = device
    env["XLA_NO_SPECIAL_SCALARS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # torch 2.7 starts inductor's compile worker processes when torch._inductor is imported
    # (torch_xla imports it) if triton is installed, as the CUDA wheels of torch on PyPI
    # install it: processes that only serve inductor's Triton backend, which torch_xla never
    # uses, and that cost about 4 s of CPU per child beside the one measured (measured on
    # stock 2.7.0: 8.7 s -> 4.8 s for `--mode import`). TPU hosts' CPU wheels have no triton
    # and never start them. Off unless the caller's environment says otherwise. See
    # https://github.com/pytorch/pytorch/blob/v2.7.0/torch/_inductor/async_compile.py
    # (the TORCH_WARM_POOL test at the end of the module).
    env.setdefault("TORCH_WARM_POOL", "0")
    # The child is run by path; a PYTHONPATH pointing into this project must not leak in.
    env.pop("PYTHONPATH", None)
    if cache_dir is not None:
        env["XLA_PERSISTENT_CACHE_PATH"] = str(cache_dir)
        env["XLA_PERSISTENT_CACHE_READ_ONLY"] = "1" if read_only else "0"
    if cpu_devices is not None and device == "CPU":
        env["CPU_NUM_DEVICES"] = str(cpu_devices)
    return env


#: What the children inherit that torch_xla, XLA, PJRT or libtpu read: variables with these
#: prefixes, and the few they read under other names (torch_xla/csrc's GetEnv* reads).
_RUNTIME_PREFIXES = ("XLA_", "PJRT_", "TPU_", "LIBTPU_", "PTXLA_", "XRT_", "TORCH_XLA_")
_RUNTIME_NAMES = frozenset(
    {
        "CPU_NUM_DEVICES",
        "DISABLE_NUMERIC_CC_TOKEN",
        "ENABLE_COLLECTIVE_MATMUL_IN_MP",
        "CONVERT_SHLO_TO_SHARDY",
        "EXPERIMENTAL_XLA_UNBOUNDED_DYNAMISM",
        "ALLOW_MULTIPLE_LIBTPU_LOAD",
        "TORCH_WARM_POOL",
    }
)
#: Set per child by the gate itself (each run's own cache): not part of the launch.
_PER_CHILD = frozenset({"XLA_PERSISTENT_CACHE_PATH", "XLA_PERSISTENT_CACHE_READ_ONLY"})
#: Recorded, but they say which host or worker ran, not how: never a reason two receipts
#: are unlike (their topology is compared on its own).
PER_HOST_NAMES = frozenset(
    {
        "TPU_WORKER_ID",
        "TPU_WORKER_HOSTNAMES",
        "TPU_PROCESS_ADDRESSES",
        "TPU_PROCESS_PORT",
        "TPU_NAME",
        "TPU_HOSTNAME_OVERRIDE",
        "XLA_COORDINATOR_ADDRESS",
    }
)
#: The pipeline's own settings (``XLA_WHEELS_NET_TIMEOUT``, the receipt store's account):
#: read by the gate, never by torch_xla or libtpu, so not how a child ran.
_PIPELINE_PREFIX = "XLA_WHEELS_"


def launch_environment(device: str) -> dict[str, str]:
    """The runtime environment every child of this gate run started with (what
    :func:`runtime_env` gives, minus each child's own cache): what a receipt records, so
    two runs under other XLA_FLAGS or other switches are told apart. Masked as every
    record is (:func:`xla_host.redact.mask_environment`: a credential by its variable's
    name, or a flag's inside XLA_FLAGS / LIBTPU_INIT_ARGS by name or value), with a digest
    that still tells two secrets apart; the children themselves get the real values."""
    env = runtime_env(device)
    recorded = {
        name: env[name]
        for name in sorted(env)
        if name not in _PER_CHILD
        and not name.startswith(_PIPELINE_PREFIX)
        and (name.startswith(_RUNTIME_PREFIXES) or name in _RUNTIME_NAMES)
    }
    return mask_environment(recorded)


T = TypeVar("T")


def run_in_parallel(tasks: Sequence[Callable[[], T]], *, side_by_side: bool) -> list[T]:
    """Run independent tasks (each a sequence of children, e.g. one check), one thread
    each when ``side_by_side``, else one after the other; results in task order.

    When one task raises, or the wait is interrupted (Ctrl-C), every running child is
    killed (``stop_all``) and the others stop at their next child; the first real error
    is raised.
    """
    if not side_by_side or len(tasks) < 2:
        return [task() for task in tasks]
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(tasks)) as pool:
            futures = [pool.submit(task) for task in tasks]
            try:
                concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
            except BaseException:
                stop_all()
                raise
            errors = [e for f in futures if f.done() and (e := f.exception()) is not None]
            if errors:
                stop_all()
                concurrent.futures.wait(futures)
                raise next((e for e in errors if not isinstance(e, ChildrenStopped)), errors[0])
            return [f.result() for f in futures]
    finally:
        _STOPPING.clear()
