"""One gate measurement, run by file path inside the environment under test.

This file runs with the interpreter of the torch_xla environment being judged, which
does not have the ``xla_wheels`` package: it imports only the standard library, torch
and torch_xla. The parent sets the runtime policy (PJRT_DEVICE, the persistent cache
path, read-only mode, XLA_NO_SPECIAL_SCALARS, CPU_NUM_DEVICES) in the environment before
this process starts, so every flag is in place before ``import torch_xla``. Results go
to the JSON file named by ``--out``, never to stdout, which torch and XLA share with
their own logging.

Modes:
  probe   import torch_xla, bring the runtime up, report versions and devices; given a
          workload, load it and call its factory once (``workload`` or
          ``workload_problem``), so a workload that cannot run is refused before any check
  import  import only (the floor of any restart)
  train   the workload (a preset of presets.py, or the user's own, loaded by
          ``--workload-file PATH:FACTORY`` or ``--workload-module MODULE:FACTORY``; the
          protocol is gate/workload.py's docstring): timings and torch_xla counters.
          A workload that breaks the protocol is reported as ``workload_problem``
          (the parent: exit 2, cannot judge), its traceback printed to this child's log
  hbm     under SPMD, query every physical runtime device through
          ``torch_xla._XLAC._xla_runtime_memory_info`` (patch 0002); ``train --spmd
          --probe-bytes N`` runs the same queries after its steps
  sharded under SPMD, ``t + t`` on a tensor sharded over every device (upstream
          test_persistent_cache.py's spmd_sharded case): the output's bytes and its
          sharding spec, which a cache hit must reproduce exactly
  canary  the recompilation canary's AdamW training loop, each ``--variant`` in turn
          (``steady`` first, then two controls, see ``gate.canary``): every counter and
          metric sample count after each variant's set-up, warm-up and measured steps, not
          a chosen few, so a counter that moves on another build is in the evidence too

``train --record-keys``: a run that records the key components of what it compiles or
loads (``keys``): for each step whose sync brought a graph, the canonical fingerprint of
the pending module (``hlo_canonical``, as the key probe's children compute it), the
persistent cache's hits and misses of that sync and the entry files it wrote; and for the
run, the compile options (XLA_FLAGS and LIBTPU_INIT_ARGS as XLA parses them, the switches
torch_xla reads when it hands a module over, custom compile options), the platform and the
revisions. Never asked of a run whose time is judged: fingerprinting costs a lowering.

Numbers are reported as ``float.hex`` (losses) or hex bytes (outputs) so the parent
compares them bit for bit, not through a decimal rendering.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import resource
import statistics
import sys
import time
import traceback
from typing import Any

_START = time.perf_counter()

#: The hbm mode's probe tensor, when ``--probe-bytes`` is not given.
DEFAULT_PROBE_BYTES = 256 * 1024 * 1024

#: The canary's variants; small enough that a CPU compile takes well under a second.
CANARY_VARIANTS = ("steady", "item-readback", "shape-drift")
CANARY_WIDTH = 128
CANARY_BATCH = 32

#: The persistent cache's outcome counters (runtime/cache.h; docs/cache-key.md "What the persistent
#: cache counters say"). Stock wheels count only the first three; the others read 0 there.
COUNTERS = (
    "PersistentCacheMiss",
    "PersistentCacheHit",
    "PersistentCacheDeserializeFailure",
    "PersistentCacheCorrupt",
    "PersistentCacheLoadRefused",
    "PersistentCacheReadFailure",
    "PersistentCacheWriteFailure",
    "UncachedCompile",
    "CachedCompile",
)


def _write(path: str, payload: dict[str, Any]) -> None:
    # Write then rename, so the parent never reads a half-written report.
    # A write that fails (a full disk) removes the partial file: no .part is left behind.
    tmp = path + ".part"
    try:
        with open(tmp, "w") as handle:
            json.dump(payload, handle, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


#: What is known so far, reported even when a later step raises: an import that worked
#: followed by a device that failed must not read as an import failure.
PROGRESS: dict[str, Any] = {}
#: Where this child says what it is doing (``<--out>.phase``, one line, written by rename):
#: a child killed as hung or stalled writes no report, and the parent reads this to say
#: whose code it hung in (the workload's own factory, or the steps the runtime runs).
PHASE_FILE: list[str] = []
PHASE_SUFFIX = ".phase"


def _phase(text: str) -> None:
    if not PHASE_FILE:
        return
    tmp = PHASE_FILE[0] + ".part"
    with contextlib.suppress(OSError):  # evidence for a hang, never a reason to fail
        with open(tmp, "w") as handle:
            handle.write(text + "\n")
        os.replace(tmp, PHASE_FILE[0])


def _import_torch_xla() -> dict[str, Any]:
    before = time.perf_counter()
    import torch
    import torch_xla

    PROGRESS.update(
        {
            "import_s": time.perf_counter() - before,
            "torch_version": torch.__version__,
            "torch_xla_version": getattr(torch_xla, "__version__", "unknown"),
        }
    )
    return dict(PROGRESS)


def _metrics() -> dict[str, Any]:
    import torch_xla.debug.metrics as met

    counters = {name: int(met.counter_value(name) or 0) for name in COUNTERS}
    compile_data = met.metric_data("CompileTime")
    execute_data = met.metric_data("ExecuteTime")
    # PersistentCacheLoad times reading + deserializing one cache entry (runtime/cache.h);
    # builds without the metric report None rather than a zero that reads as "instant".
    load_data = met.metric_data("PersistentCacheLoad")
    return {
        "counters": counters,
        # CompileTime gets one sample per real XLA compilation (PJRT client Compile);
        # a persistent-cache hit skips it.
        "xla_compiles": int(compile_data[0]) if compile_data else 0,
        "compile_time_s": float(compile_data[1]) / 1e9 if compile_data else 0.0,
        "executions": int(execute_data[0]) if execute_data else 0,
        "cache_loads": int(load_data[0]) if load_data else 0,
        "cache_load_time_s": float(load_data[1]) / 1e9 if load_data else None,
        "all_counter_names": sorted(met.counter_names()),
    }


def _memory(spmd: bool) -> dict[str, Any]:
    """Memory figures of this run: the process's peak host memory, and each device's own
    account where the runtime keeps one.

    Host: ``getrusage(RUSAGE_SELF).ru_maxrss`` (KiB on Linux), the peak resident set of
    this whole process up to now, import included. Devices: ``bytes_used``, ``bytes_limit``
    and ``peak_bytes_used`` as the PJRT client's allocator statistics give them (TPU HBM).
    Under SPMD the virtual device has none: the physical devices are asked through patch
    0002's ``_xla_runtime_memory_info`` where the build has it. XLA:CPU keeps no allocator
    statistics (GetAllocatorStats is UNIMPLEMENTED): "not reported", with the runtime's
    answer, never a zero.
    """
    import torch_xla

    devices: dict[str, Any] = {}
    binding = getattr(torch_xla._XLAC, "_xla_runtime_memory_info", None)
    if spmd and binding is not None:
        queries = [(device, binding) for device in _runtime_devices()]
    else:
        queries = [(str(torch_xla.device()), torch_xla._XLAC._xla_memory_info)]
    for device, query in queries:
        try:
            devices[device] = {k: int(v) for k, v in dict(query(device)).items()}
        except Exception as error:
            devices[device] = {"not_reported": _error_text(error)}
    return {
        "host_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "device_memory": devices,
    }


def _runtime_devices() -> list[str]:
    """The runtime devices this process can address: on a multi-host slice the global
    list (``_xla_get_all_runtime_devices``) holds other hosts' chips too, which no query
    of this process reaches. ``_xla_get_runtime_devices`` is the local list torch_xla's
    own code uses (``torch_xla._internal.tpu``, 2.7-2.9); on one host both are the same."""
    import torch_xla

    local = getattr(torch_xla._XLAC, "_xla_get_runtime_devices", None)
    every = local if local is not None else torch_xla._XLAC._xla_get_all_runtime_devices
    return [str(d) for d in every()]


#: The built-in presets: a file of this directory, loaded like any user's workload file.
PRESETS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets.py")
#: Steps after which a step may no longer bring a new graph, unless the workload says
#: otherwise (``warmup_steps``): the first step compiles; an optimizer that creates its
#: state on the first step (Adam, AdamW) makes the second one another graph.
WARMUP_STEPS = 2
#: The fields of the object a workload factory returns (gate/workload.py).
REQUIRED_FIELDS = ("model", "inputs", "step", "steps")
#: Counters whose movement in a sync means the step brought a graph this process had not
#: run yet: compiled (``UncachedCompile``) or loaded from the persistent cache
#: (``PersistentCacheHit``; a disk hit counts as ``CachedCompile``, as an in-memory one
#: does, so ``UncachedCompile`` alone misses a warm run's graphs). Measured on stock 2.7.0.
NEW_GRAPH_COUNTERS = ("UncachedCompile", "PersistentCacheHit")


class WorkloadProblem(Exception):
    """The workload breaks the protocol: the gate cannot judge it (the parent: exit 2)."""


def _workload_reference(args: argparse.Namespace) -> tuple[str, str, bool]:
    """(name, ``where:factory``, is a file) of the workload the parent named."""
    if args.workload_module:
        return args.workload_name or args.workload_module, args.workload_module, False
    reference = args.workload_file or f"{PRESETS_FILE}:small"
    return args.workload_name or reference, reference, True


def _load_factory(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """Import the workload's module (by path, or by name in this environment) and find its
    factory; return it with the workload's identity (name, source file and its sha256)."""
    name, reference, is_file = _workload_reference(args)
    where, _, factory_name = reference.rpartition(":")
    if is_file:
        directory = os.path.dirname(where)
        # Its neighbours importable, as `python file.py` would have them; never the gate's
        # own directory (its modules' names must not shadow anything).
        if directory != os.path.dirname(PRESETS_FILE) and directory not in sys.path:
            sys.path.insert(0, directory)
        module_name = "_xla_gate_workload"
        spec = importlib.util.spec_from_file_location(module_name, where)
        if spec is None or spec.loader is None:
            raise WorkloadProblem(f"{where} cannot be loaded as a Python file")
        module = importlib.util.module_from_spec(spec)
        # Registered before it runs: dataclasses (and pickling) look their module up there.
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            raise WorkloadProblem(f"loading {where} raised {_error_text(error)}") from error
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as error:
            raise WorkloadProblem(
                f"module {where} is not importable in {sys.executable} ({_error_text(error)})"
            ) from error
        except Exception as error:
            raise WorkloadProblem(f"importing {where} raised {_error_text(error)}") from error
    source = getattr(module, "__file__", None)
    factory = getattr(module, factory_name, None)
    if factory is None:
        defined = sorted(
            key
            for key, value in vars(module).items()
            if callable(value)
            and not key.startswith("_")
            and getattr(value, "__module__", None) == module.__name__
        )
        raise WorkloadProblem(
            f"{where} has no factory {factory_name} (it defines: {', '.join(defined) or 'none'})"
        )
    if not callable(factory):
        kind = type(factory).__name__
        raise WorkloadProblem(f"{where}: {factory_name} is a {kind}, not callable")
    identity: dict[str, Any] = {"name": name, "reference": reference, "source": source}
    if source is None:
        raise WorkloadProblem(f"{where} has no source file to take a digest of")
    with open(source, "rb") as handle:
        identity["sha256"] = hashlib.sha256(handle.read()).hexdigest()
    return factory, identity


def _field(made: Any, key: str) -> Any:
    if isinstance(made, dict):
        return made.get(key)
    return getattr(made, key, None)


def build_workload(args: argparse.Namespace, device: Any, mesh: Any) -> dict[str, Any]:
    """Load the workload, call its factory and check what it returned (the protocol)."""
    import torch

    _phase("loading the workload's module")
    factory, identity = _load_factory(args)
    offered = {"device": device, "mesh": mesh}
    parameters: list[inspect.Parameter] = []
    # No signature to read (a builtin, a C extension's callable): it is called bare.
    with contextlib.suppress(TypeError, ValueError):
        parameters = list(inspect.signature(factory).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        kwargs = offered
    else:
        named = {p.name for p in parameters}
        kwargs = {key: value for key, value in offered.items() if key in named}
    label = identity["name"]
    _phase(f"the workload's factory ({identity['reference']})")
    try:
        made = factory(**kwargs)
    except Exception as error:
        raise WorkloadProblem(f"its factory raised {_error_text(error)}") from error
    _phase("the training steps")
    missing = [key for key in REQUIRED_FIELDS if _field(made, key) is None]
    if missing:
        raise WorkloadProblem(
            f"its factory returned a {type(made).__name__} without {', '.join(missing)} "
            f"(a dict or an object with {', '.join(REQUIRED_FIELDS)} and optionally params)"
        )
    model, inputs, step, steps = (_field(made, key) for key in REQUIRED_FIELDS)
    if not isinstance(model, torch.nn.Module):
        raise WorkloadProblem(f"model is a {type(model).__name__}, not a torch.nn.Module")
    placed = {str(p.device.type) for p in model.parameters()}
    if placed - {"xla"}:
        raise WorkloadProblem(
            f"model has parameters on {', '.join(sorted(placed - {'xla'}))}, not on the XLA "
            "device: move it to the factory's device argument"
        )
    if not callable(step):
        raise WorkloadProblem(f"step is a {type(step).__name__}, not callable")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise WorkloadProblem(f"steps is {steps!r}, not an int >= 1")
    warmup = _field(made, "warmup_steps")
    if warmup is None:
        warmup = WARMUP_STEPS
    elif isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise WorkloadProblem(f"warmup_steps is {warmup!r}, not an int >= 1")
    elif steps <= warmup:
        # The steady state is a step after the warm-up: a run that never reaches one
        # cannot show that its graphs stopped changing.
        raise WorkloadProblem(
            f"steps ({steps}) must exceed warmup_steps ({warmup}): the steady state is a "
            "step after the warm-up"
        )
    params = _field(made, "params")
    if params is None:
        params = {}
    try:
        if not isinstance(params, dict):
            raise TypeError(f"a {type(params).__name__}, not a dict")
        params = json.loads(json.dumps(params, sort_keys=True))
    except (TypeError, ValueError) as error:
        raise WorkloadProblem(f"params is not a dict of JSON values: {error}") from error
    make_inputs = inputs if callable(inputs) else (lambda _index: inputs)
    identity["params"] = params
    return {
        "label": label,
        "identity": identity,
        "model": model,
        "make_inputs": make_inputs,
        "step": step,
        "steps": steps,
        "warmup_steps": warmup,
    }


def _step_inputs(workload: dict[str, Any], index: int) -> tuple[Any, ...]:
    import torch

    made = workload["make_inputs"](index)
    inputs = (made,) if isinstance(made, torch.Tensor) else made
    if not isinstance(inputs, tuple | list) or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise WorkloadProblem(
            f"inputs of step {index + 1} are a {type(made).__name__}, not a tensor or a tuple "
            "of tensors"
        )
    return tuple(inputs)


def _shapes(tensors: tuple[Any, ...]) -> list[list[int]]:
    return [list(t.shape) for t in tensors]


def mode_probe(args: argparse.Namespace) -> dict[str, Any]:
    result = _import_torch_xla()
    import torch_xla
    import torch_xla.runtime as xr

    result["device_type"] = xr.device_type()
    result["runtime_devices"] = _runtime_devices()
    result["has_runtime_memory_info"] = hasattr(torch_xla._XLAC, "_xla_runtime_memory_info")
    result["tpu_version"] = None
    result["accelerator_type"] = None
    if result["device_type"] == "TPU":
        try:
            # torch_xla has no public accessor for the chip generation in 2.7-2.9.
            from torch_xla._internal import tpu as tpu_internal

            result["tpu_version"] = int(tpu_internal.version())
            # The slice's type (v6e-32): what a receipt's topology is (xla_host.gate.slice).
            result["accelerator_type"] = str(tpu_internal.get_tpu_env()["ACCELERATOR_TYPE"])
        except Exception:  # informative only: the HBM table falls back to a wide ceiling
            pass
    if args.workload_file or args.workload_module:
        # The factory called once, on the single device, before any check starts: a
        # workload that cannot run is refused in seconds, not after the first cold run.
        try:
            result["workload"] = build_workload(args, torch_xla.device(), None)["identity"]
        except WorkloadProblem as problem:
            traceback.print_exc()  # into this child's log, which the parent's error names
            result["workload_problem"] = str(problem)
    return result


def _custom_compile_options(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Apply ``--custom-compile-option KEY=VALUE`` where the build has the API."""
    import torch_xla

    setter = getattr(torch_xla, "set_custom_compile_options", None)
    result["has_set_custom_compile_options"] = setter is not None
    options = dict(item.split("=", 1) for item in args.custom_compile_option)
    result["custom_compile_options"] = options if setter is not None else {}
    if options and setter is not None:
        setter(options)


def mode_train(args: argparse.Namespace) -> dict[str, Any]:
    result = _import_torch_xla()
    ready_from = time.perf_counter()
    # CPU seconds of this process (every thread) over the same span as ready_s: reported
    # next to it, as another process on the machine stretches wall time, not CPU time.
    ready_cpu_from = time.process_time()
    import torch
    import torch_xla
    import torch_xla.runtime as xr

    if args.spmd:
        # Must precede every XLA tensor (the users' runtime contract).
        xr.use_spmd()
    _custom_compile_options(args, result)
    device = torch_xla.device()
    mesh = None
    if args.spmd:
        import numpy as np
        import torch_xla.distributed.spmd as xs

        count = xr.global_runtime_device_count()
        mesh = xs.Mesh(np.arange(count), (count, 1), ("data", "model"))
    workload = build_workload(args, device, mesh)
    PROGRESS["workload"] = workload["identity"]
    steps = workload["steps"] if args.steps is None else args.steps
    trace = _Trace()
    _train_steps(args, workload, steps, trace, result, ready_from)
    ready = ready_figures(trace.rows, ready_from, ready_cpu_from)
    if args.lowering_cost:
        result["lowering"] = trace.lowering
    if args.record_keys:
        components = _key_components(args, torch, torch_xla)
        result["keys"] = {"components": components, "graphs": trace.key_rows}
    result.update(_metrics())
    result.update(_memory(bool(args.spmd)))
    if args.spmd and args.probe_bytes is not None:
        # The HBM check's queries, after the counters were read: they share this run's
        # import and SPMD runtime instead of starting a process of their own. A failure
        # here is the HBM check's evidence, not this run's.
        try:
            result["hbm"] = {"ok": True, **_hbm_queries(args.probe_bytes)}
        except Exception as error:
            result["hbm"] = {"ok": False, "error": _error_text(error)}
    steady = trace.step_times[ready["steps"] :] or trace.step_times
    result.update(
        {
            "workload": workload["identity"],
            "steps": steps,
            "warmup_steps": workload["warmup_steps"],
            "shapes": trace.first_shapes,
            "spmd": bool(args.spmd),
            "ready": ready,
            "ready_s": ready["ready_s"],
            "ready_cpu_s": ready["ready_cpu_s"],
            "time_to_first_step_s": trace.rows[0]["ended"] - _START,
            "step_times_s": trace.step_times,
            "steady_step_s": statistics.median_high(steady),
            "losses": trace.losses,
            "loss_hex": [value.hex() for value in trace.losses],
        }
    )
    return result


class _Trace:
    """What the training steps leave for the report. (A plain class: the gate loads this
    file without registering it in sys.modules, which a dataclass needs.)"""

    def __init__(self) -> None:
        self.step_times: list[float] = []
        self.losses: list[float] = []
        #: One row per step: the timestamps that tile it and what its sync compiled or loaded.
        self.rows: list[dict[str, Any]] = []
        self.first_shapes: dict[str, Any] | None = None
        self.lowering: list[dict[str, Any]] = []
        self.key_rows: list[dict[str, Any]] = []


def _train_steps(
    args: argparse.Namespace,
    workload: dict[str, Any],
    steps: int,
    trace: _Trace,
    result: dict[str, Any],
    ready_from: float,
) -> None:
    """Run and time ``steps`` steps of ``workload`` into ``trace``; the first step's
    figures go into ``result``. A workload that breaks the restart's contract (a loss that
    is not one value, shapes or graphs that change after warm-up) is a WorkloadProblem."""
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met

    warmup = workload["warmup_steps"]
    for index in range(steps):
        # Made before the step's clock starts: a workload's own input pipeline is not what
        # a persistent cache saves (in time-to-ready it counts as setup).
        inputs = _step_inputs(workload, index)
        # Read outside the timed spans; around the whole step too, as a step that reads a
        # value back mid-step (``.item()``) brings its graph before the sync.
        step_before = _graph_work(met)
        began = time.perf_counter()
        loss = workload["step"](*inputs)
        if not isinstance(loss, torch.Tensor):
            raise WorkloadProblem(f"step returned a {type(loss).__name__}, not the loss tensor")
        if (args.lowering_cost or args.record_keys) and index < warmup:
            trace.lowering.append(_lowering_cost(index, torch, torch_xla))
        cache_before = _cache_files() if args.record_keys else set()
        counters_before = _counters(met) if args.record_keys else {}
        sync_before = _graph_work(met)
        traced = time.perf_counter()
        traced_cpu = time.process_time()
        # Graph hashing, the cache lookup, compiling or loading the executable, and
        # queueing its execution all happen inside the sync; execution itself is async.
        torch_xla.sync()
        synced = time.perf_counter()
        sync_cpu_s = time.process_time() - traced_cpu
        in_sync = _graph_work_since(sync_before, _graph_work(met))
        if loss.numel() != 1:
            shape = list(loss.shape)
            raise WorkloadProblem(f"step returned a loss of shape {shape}, not one value")
        # Reading the loss waits for the device, so the step is really finished.
        trace.losses.append(float(loss.item()))
        now = time.perf_counter()
        trace.step_times.append(now - began)
        work = _graph_work_since(step_before, _graph_work(met))
        graphs = int(work["graphs"] or 0)
        spans = {
            "trace_s": traced - began,
            "sync_s": synced - traced,
            "sync_cpu_s": sync_cpu_s,
            "execute_s": now - synced,
        }
        trace.rows.append(_step_row(spans, now, graphs, work, in_sync))
        _check_shapes(trace, index, {"inputs": _shapes(inputs), "loss": list(loss.shape)})
        if trace.lowering and trace.lowering[-1]["step"] == index + 1:
            # Only a step whose sync brought a new graph is one a disk key is taken for.
            trace.lowering[-1]["new_graph"] = graphs > 0
            if args.record_keys and graphs:
                trace.key_rows.append(
                    _key_row(index, trace.lowering[-1]["module"], counters_before,
                             _counters(met), work, sorted(_cache_files() - cache_before))
                )  # fmt: skip
        if index >= warmup and graphs:
            raise WorkloadProblem(
                f"step {index + 1} brought {graphs} new graph(s) after {warmup} "
                "warm-up steps (torch_xla compiled or loaded a graph it had not run: "
                "UncachedCompile or PersistentCacheHit moved): the step's shapes change "
                "between steps, or it feeds a new constant into its graph every step; a "
                "workload that needs more warm-up steps says so (warmup_steps)"
            )
        if index == 0:
            result["first_step"] = {"setup_s": began - ready_from, **spans}


def _step_row(
    spans: dict[str, float],
    now: float,
    graphs: int,
    work: dict[str, float | int | None],
    in_sync: dict[str, float | int | None],
) -> dict[str, Any]:
    """A step's row: its timed spans, when it ended, what it compiled or loaded."""
    return {
        **spans,
        "ended": now,
        "ended_cpu": time.process_time(),
        "graphs": graphs,
        "compiles": work["compiles"],
        "loads": work["loads"],
        # The sync's own: the breakdown splits the sync into them and the rest.
        "compile_s": in_sync["compile_s"],
        "load_s": in_sync["load_s"],
    }


def _check_shapes(trace: _Trace, index: int, shapes: dict[str, Any]) -> None:
    """The first step's shapes kept; a later step with others is a WorkloadProblem."""
    if trace.first_shapes is None:
        trace.first_shapes = shapes
    elif shapes != trace.first_shapes:
        raise WorkloadProblem(
            f"shapes change between steps: step {index + 1} has {shapes}, step 1 had "
            f"{trace.first_shapes} (a restart is judged on a fixed set of graphs)"
        )


def _key_row(
    index: int,
    module: Any,
    before: dict[str, int],
    after: dict[str, int],
    work: dict[str, float | int | None],
    entries: list[str],
) -> dict[str, Any]:
    """The disk key a step's new graph was looked up under, and what the lookup did."""
    return {
        "step": index + 1,
        "module": module,
        "hits": after["PersistentCacheHit"] - before["PersistentCacheHit"],
        "misses": after["PersistentCacheMiss"] - before["PersistentCacheMiss"],
        "compiles": work["compiles"],
        "entries": entries,
    }


def _graph_work(met: Any) -> dict[str, float | int | None]:
    """The counters and timers a sync moves when it brings a graph: new graphs, XLA
    compiles and their time (``CompileTime``), executable loads and their time
    (``PersistentCacheLoad``; None on a build without the timer, or before its first
    sample)."""
    compiled = met.metric_data("CompileTime")
    loaded = met.metric_data("PersistentCacheLoad")
    return {
        "graphs": sum(int(met.counter_value(name) or 0) for name in NEW_GRAPH_COUNTERS),
        "compiles": int(compiled[0]) if compiled else 0,
        "compile_s": float(compiled[1]) / 1e9 if compiled else 0.0,
        "loads": int(loaded[0]) if loaded else 0,
        "load_s": float(loaded[1]) / 1e9 if loaded else None,
    }


def _graph_work_since(
    before: dict[str, float | int | None], after: dict[str, float | int | None]
) -> dict[str, float | int | None]:
    """What one sync did: the difference of two :func:`_graph_work` readings."""
    load_s = None
    if after["load_s"] is not None:
        load_s = float(after["load_s"]) - float(before["load_s"] or 0.0)
    return {
        "graphs": int(after["graphs"] or 0) - int(before["graphs"] or 0),
        "compiles": int(after["compiles"] or 0) - int(before["compiles"] or 0),
        "compile_s": float(after["compile_s"] or 0.0) - float(before["compile_s"] or 0.0),
        "loads": int(after["loads"] or 0) - int(before["loads"] or 0),
        "load_s": load_s,
    }


def ready_figures(
    rows: list[dict[str, Any]], ready_from: float, ready_cpu_from: float
) -> dict[str, Any]:
    """Time-to-ready and its parts, from the steps' rows: the run is ready at the end of
    the last step that brought a new graph (the steps after it, the steady state, bring
    none: the run checked that no step after the warm-up does), so time-to-ready covers
    every graph the first steps compile or load, not only the first step's.

    The parts tile it: ``setup_s`` is everything outside the steps (building the model,
    making each step's inputs), and each sync holds its compile and load (their metrics
    are read around the sync alone), so setup + trace + sync + execute == ready_s and
    compile + load <= sync, with no clamping."""
    bringing = [i for i, row in enumerate(rows) if row["graphs"] > 0]
    # A fresh process brings its first graph at step 1; should a factory have run every
    # graph already, the first step still ends the warm-up.
    steps = (bringing[-1] + 1) if bringing else 1
    warm = rows[:steps]
    end = warm[-1]

    def total(key: str) -> float:
        return sum(float(row[key]) for row in warm)

    loads = [row["load_s"] for row in warm if row["load_s"] is not None]
    ready_s = end["ended"] - ready_from
    inside = total("trace_s") + total("sync_s") + total("execute_s")
    return {
        "steps": steps,
        "steady_state_step": steps + 1 if steps < len(rows) else None,
        "graphs": sum(int(row["graphs"]) for row in warm),
        "compiles": sum(int(row["compiles"]) for row in warm),
        "loads": sum(int(row["loads"]) for row in warm),
        "ready_s": ready_s,
        "ready_cpu_s": end["ended_cpu"] - ready_cpu_from,
        "setup_s": ready_s - inside,
        "trace_s": total("trace_s"),
        "sync_s": total("sync_s"),
        "sync_cpu_s": total("sync_cpu_s"),
        "execute_s": total("execute_s"),
        "compile_s": total("compile_s"),
        "load_s": sum(loads) if loads else None,
    }


def _cache_files() -> set[str]:
    """The persistent cache directory's entry files (hidden and temporary names left out)."""
    path = os.environ.get("XLA_PERSISTENT_CACHE_PATH")
    if not path or not os.path.isdir(path):
        return set()
    return {name for name in os.listdir(path) if not name.startswith(".")}


def _counters(met: Any) -> dict[str, int]:
    return {name: int(met.counter_value(name) or 0) for name in COUNTERS}


#: Switches that change the lowered module (so a module fingerprint differs under them):
#: named next to a module that differs, so the explanation can say which one moved.
MODULE_SWITCHES = (
    "XLA_USE_BF16",
    "XLA_DOWNCAST_BF16",
    "XLA_USE_32BIT_LONG",
    "XLA_NO_SPECIAL_SCALARS",
    "XLA_USE_SPMD",
)


def _key_components(args: argparse.Namespace, torch: Any, torch_xla: Any) -> dict[str, Any]:
    """The run's side of every key it takes: what reaches the compiler besides the module
    (the key probe child's ``compile_side``), the platform and the revisions."""
    import importlib.metadata

    spec = importlib.util.spec_from_file_location(
        "_xla_gate_key_probe_child", os.path.join(os.path.dirname(__file__), "key_probe_child.py")
    )
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    options = dict(item.split("=", 1) for item in args.custom_compile_option)
    try:
        libtpu: str | None = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        libtpu = None
    import torch_xla.runtime as xr

    version = importlib.import_module("torch_xla.version")
    return {
        "compile_options": probe.compile_side(options),
        "module_switches": {k: os.environ[k] for k in MODULE_SWITCHES if k in os.environ},
        "platform": {
            "device": str(xr.device_type()),
            "devices": int(xr.global_runtime_device_count()),
            "libtpu": libtpu,
        },
        "revisions": {
            "torch": str(torch.__version__),
            "torch_xla": str(getattr(torch_xla, "__version__", "unknown")),
            "torch_xla_git": getattr(version, "__xla_gitrev__", None),
            "torch_git": getattr(version, "__torch_gitrev__", None),
        },
    }


def _lowering_cost(index: int, torch: Any, torch_xla: Any) -> dict[str, Any]:
    """What keying a disk entry on the lowered module costs for the graph this step's sync
    is about to compile: lowering every pending XLA tensor to HLO text and its canonical
    fingerprint (``hlo_canonical``, loaded by path). Finding the pending tensors (a scan
    of the garbage collector's objects) is not part of the figure: the C++ key lowers
    the graph the sync already holds. Taken only where ``--lowering-cost`` asks (the
    restart benchmark's own run), never inside a run whose time is judged."""
    import gc

    pending = [
        obj
        for obj in gc.get_objects()
        if isinstance(obj, torch.Tensor) and obj.device.type == "xla"
    ]
    began = time.perf_counter()
    text = torch_xla._XLAC._get_xla_tensors_hlo(pending)
    lowered = time.perf_counter()
    spec = importlib.util.spec_from_file_location(
        "_xla_gate_hlo_canonical", os.path.join(os.path.dirname(__file__), "hlo_canonical.py")
    )
    assert spec is not None and spec.loader is not None
    canonical = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(canonical)
    fingerprinted_from = time.perf_counter()
    module = canonical.fingerprint(text)
    done = time.perf_counter()
    return {
        "step": index + 1,
        "tensors": len(pending),
        "hlo_chars": len(text),
        "module": module,
        "lower_s": lowered - began,
        "fingerprint_s": done - fingerprinted_from,
    }


def mode_sharded(args: argparse.Namespace) -> dict[str, Any]:
    result = _import_torch_xla()
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    count = xr.global_runtime_device_count()
    torch.manual_seed(0)
    host = torch.randn(16 * count)
    tensor = host.to(torch_xla.device())
    mesh = xs.Mesh(np.arange(count), (count,))
    xs.mark_sharding(tensor, mesh, (0,))
    output = tensor + tensor
    torch_xla.sync()
    values = output.cpu()
    result.update(_metrics())
    result.update(
        {
            "devices": count,
            "input_sharding_spec": torch_xla._XLAC._get_xla_sharding_spec(tensor),
            "output_sharding_spec": torch_xla._XLAC._get_xla_sharding_spec(output),
            "output_hex": values.numpy().tobytes().hex(),
            "output_correct": bool(torch.equal(values, host + host)),
        }
    )
    return result


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def mode_hbm(args: argparse.Namespace) -> dict[str, Any]:
    result = _import_torch_xla()
    import torch_xla.runtime as xr

    xr.use_spmd()
    probe_bytes = DEFAULT_PROBE_BYTES if args.probe_bytes is None else args.probe_bytes
    result.update(_hbm_queries(probe_bytes))
    return result


def _hbm_queries(probe_bytes: int) -> dict[str, Any]:
    """Under SPMD (already on), ask every physical device for its memory, before and after
    placing a ``probe_bytes`` tensor replicated onto every device. Compiles nothing, so a
    cold run that does this after its steps leaves its cache as the steps left it."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    devices = _runtime_devices()
    result: dict[str, Any] = {"runtime_devices": devices, "device_type": xr.device_type()}
    # Every host's devices, counted only: the queries go to this process's own.
    result["global_device_count"] = len(torch_xla._XLAC._xla_get_all_runtime_devices())
    binding = getattr(torch_xla._XLAC, "_xla_runtime_memory_info", None)
    result["has_binding"] = binding is not None
    # What stock torch_xla offers under SPMD, recorded as context for the verdict.
    try:
        xm.get_memory_info(torch_xla.device())
        result["stock_memory_info_under_spmd"] = "ok"
    except Exception as error:
        result["stock_memory_info_under_spmd"] = _error_text(error)
    if binding is None:
        return result

    def query(device: str) -> dict[str, Any]:
        try:
            info = binding(device)
            return {"ok": True, "info": {k: int(v) for k, v in dict(info).items()}}
        except Exception as error:
            return {"ok": False, "error": _error_text(error)}

    result["before"] = {device: query(device) for device in devices}
    result["unknown_device"] = query(f"{devices[0].split(':')[0]}:{len(devices) + 97}")
    if all(entry["ok"] for entry in result["before"].values()):
        # A replicated tensor occupies its full size on every physical device. Placed and
        # waited for, never computed on: a computation would compile (and, in a cold run,
        # write a cache entry).
        elements = probe_bytes // 4
        tensor = torch.ones(elements, dtype=torch.float32).to(torch_xla.device())
        torch_xla.sync()
        xm.wait_device_ops()
        result["probe_bytes"] = elements * 4
        result["after"] = {device: query(device) for device in devices}
        del tensor
    return result


def _all_counts() -> dict[str, dict[str, int]]:
    """Every counter's value and every metric's sample count, by name."""
    import torch_xla.debug.metrics as met

    counters = {name: int(met.counter_value(name) or 0) for name in met.counter_names()}
    metrics: dict[str, int] = {}
    for name in met.metric_names():
        data = met.metric_data(name)
        metrics[name] = int(data[0]) if data else 0
    return {"counters": counters, "metrics": metrics}


def mode_canary(args: argparse.Namespace) -> dict[str, Any]:
    result = _import_torch_xla()
    steps = 8 if args.steps is None else args.steps
    # In the order given (the parent puts the steady step first, so no control's compiles
    # or transfers can come before it); each variant builds its own model and optimizer and
    # is judged on the counters' movement over its own steps. A variant that finished is
    # kept in PROGRESS: should a later one raise, its evidence is still reported.
    # A list: the report is written with sorted keys, and the order is part of the evidence.
    variants: list[dict[str, Any]] = PROGRESS.setdefault("variants", [])
    for variant in args.variant or CANARY_VARIANTS:
        variants.append(_canary_variant(variant, args.warmup, steps))
    result["variants"] = variants
    return result


def _canary_variant(variant: str, warmup: int, steps: int) -> dict[str, Any]:
    import torch
    import torch_xla

    device = torch_xla.device()
    torch.manual_seed(0)
    width, batch = CANARY_WIDTH, CANARY_BATCH
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
    ).to(device)
    # The per-step scalars live on the device: a tensor learning rate, and capturable=True
    # keeps AdamW's step count on the device too, so its bias corrections are computed
    # there. With capturable=False the step count stays on the CPU and the bias
    # corrections become new Python floats every step (one host-to-device transfer each).
    # foreach=False is what torch picks for XLA parameters anyway (torch.optim.optimizer.
    # _default_to_fused_or_foreach enables foreach only on its native device types); it is
    # explicit so a torch upgrade cannot change which update path is measured.
    learning_rate = torch.tensor(1e-3, device=device)
    decay = torch.tensor(0.99, device=device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=learning_rate, weight_decay=0.01, capturable=True, foreach=False
    )
    inputs = torch.randn(batch, width).to(device)
    targets = torch.randn(batch, 1).to(device)
    readbacks: list[float] = []

    def step(index: int) -> None:
        batch_inputs, batch_targets = inputs, targets
        if variant == "shape-drift":
            rows = batch + index
            batch_inputs = torch.randn(rows, width).to(device)
            batch_targets = torch.randn(rows, 1).to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(batch_inputs), batch_targets)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            # The schedule runs on the device: no new Python scalar enters the graph.
            learning_rate.mul_(decay)
        torch_xla.sync()
        if variant == "item-readback":
            readbacks.append(float(loss.item()))

    snapshots = {"set_up": _all_counts()}
    for index in range(warmup):
        step(index)
    snapshots["after_warmup"] = _all_counts()
    for index in range(warmup, warmup + steps):
        step(index)
    snapshots["after_steps"] = _all_counts()
    # Read only after the last snapshot: the final value must not count as a step's transfer.
    final_learning_rate = float(learning_rate.cpu())
    return {
        "ok": True,
        "variant": variant,
        "warmup_steps": warmup,
        "steps": steps,
        "lr_is_tensor": isinstance(optimizer.param_groups[0]["lr"], torch.Tensor),
        "final_learning_rate": final_learning_rate,
        "readbacks": len(readbacks),
        "snapshots": snapshots,
    }


MODES = {
    "probe": mode_probe,
    "import": lambda args: _import_torch_xla(),
    "train": mode_train,
    "hbm": mode_hbm,
    "sharded": mode_sharded,
    "canary": mode_canary,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=sorted(MODES), required=True)
    parser.add_argument("--out", required=True, help="JSON report path")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--workload-file",
        metavar="PATH:FACTORY",
        help=f"the workload's file and factory (default: {PRESETS_FILE}:small)",
    )
    where.add_argument("--workload-module", metavar="MODULE:FACTORY")
    parser.add_argument("--workload-name", help="the workload's name in reports")
    parser.add_argument("--spmd", action="store_true")
    parser.add_argument(
        "--probe-bytes",
        type=int,
        help="the HBM queries' probe tensor size (hbm: default 256 MiB; train --spmd: when "
        "given, the hbm mode's queries run after the steps)",
    )
    parser.add_argument("--steps", type=int, help="override the workload's steps")
    parser.add_argument(
        "--variant",
        action="append",
        choices=CANARY_VARIANTS,
        help="canary variant to run, in order (repeatable; default: all, steady first)",
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--lowering-cost",
        action="store_true",
        help="train: before each warm-up step's sync, time lowering the pending graph to HLO "
        "and its canonical fingerprint (the restart benchmark's figure of the module key)",
    )
    parser.add_argument(
        "--record-keys",
        action="store_true",
        help="train: record the key components of each graph it compiles or loads (keys)",
    )
    parser.add_argument(
        "--custom-compile-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="torch_xla.set_custom_compile_options entry (where the build has it)",
    )
    args = parser.parse_args(argv)
    PHASE_FILE[:] = [args.out + PHASE_SUFFIX]
    _phase(f"mode {args.mode}: starting (torch and torch_xla)")
    payload: dict[str, Any] = {"mode": args.mode, "pid": os.getpid(), "python": sys.executable}
    # The cache this process was given, as it saw it: a slice's reader shows here that
    # every one of its children ran read-only (it writes nothing to the shared directory).
    payload["persistent_cache"] = {
        "path": os.environ.get("XLA_PERSISTENT_CACHE_PATH"),
        "read_only": os.environ.get("XLA_PERSISTENT_CACHE_READ_ONLY") == "1",
    }
    try:
        payload.update(MODES[args.mode](args))
        payload["ok"] = True
        code = 0
    except BaseException as error:  # reported to the parent as data, not a traceback dump
        payload.update(PROGRESS)
        if isinstance(error, WorkloadProblem):
            payload["workload_problem"] = str(error)
            traceback.print_exc()  # into this child's log, which the parent's error names
        payload.update(
            {"ok": False, "error": _error_text(error), "traceback": traceback.format_exc()}
        )
        code = 3
    _write(args.out, payload)
    return code


if __name__ == "__main__":
    sys.exit(main())
