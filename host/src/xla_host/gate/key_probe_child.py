"""The key probe's program, run by file path inside the environment under test.

Like ``child_workload.py`` it imports only the standard library, torch and torch_xla (and
``hlo_canonical.py`` beside it, by path): the environment under test has no xla_host. The
parent sets the runtime policy and the one probed input in the environment before this
process starts; setters and custom compile options come as arguments, applied before the
first graph.

It runs a fixed set of small graphs, each chosen to show one family of inputs (:data:`GRAPHS`).
For each graph, before syncing it, the child lowers the pending outputs to HLO text
(``torch_xla._XLAC._get_xla_tensors_hlo``) and fingerprints it with the canonical rules
(``hlo_canonical.fingerprint``): the program this process would compile. It then syncs and
reads the persistent cache's counters around that one sync, so each graph's row says
whether this process loaded an executable (a hit) or compiled one, next to the program it
wanted. The parent compares those rows with the cold run's (``keyprobe.judge_key_probe``).

The compile side: what reaches XLA besides the module (``compile_side``): XLA_FLAGS and
LIBTPU_INIT_ARGS as XLA parses them (a value without a leading ``-`` names a file of
flags, the last value of a flag wins, dump and logging flags left out), and the custom
compile options. Read after ``import torch_xla``, which adds its own defaults to XLA_FLAGS.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The graphs, in the order they run, and the inputs each is there to show.
GRAPHS = {
    "cast": "an int32 tensor cast to float32 and reduced (XLA_USE_BF16, XLA_DOWNCAST_BF16)",
    "matmul": "a float32 matmul (the matmul precision, fast-math flags)",
    "long": "an int64 product reduced (XLA_USE_32BIT_LONG)",
    "gather": "a gather along a dimension of 64 (XLA_DENSE_GATHER_FACTOR on TPU)",
    "scatter": "a scatter-add of 512 indices into 4096 elements (XLA_DENSE_SCATTER_FACTOR on TPU)",
    "scalars": "an add and a multiply by the Python numbers 1 and 0 (XLA_NO_SPECIAL_SCALARS)",
}

COUNTERS = ("PersistentCacheHit", "PersistentCacheMiss", "PersistentCacheDeserializeFailure")

#: Flags that change neither the program nor the code XLA makes of it: dumps and logging
#: (JAX's exclusion list, jax/_src/cache_key.py, is all ``--xla_dump_*`` but one).
_OUTSIDE_PREFIXES = ("xla_dump_",)
_OUTSIDE_NAMES = frozenset(
    {
        "xla_force_host_platform_device_count",
        "v",
        "vmodule",
        "log_dir",
        "logtostderr",
        "alsologtostderr",
        "stderrthreshold",
        "minloglevel",
    }
)


def _sibling(name: str) -> Any:
    """A module beside this file, loaded by path (no package to import from here):
    ``hlo_canonical``, and ``child_workload`` for its report writer."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_xla_gate_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parsed_flags(value: str) -> dict[str, str]:
    """Flags as XLA's parser ends up with them (``xla/parse_flags_from_env.cc``): a value
    that does not start with ``-`` names a file whose text holds the flags; flags are
    whitespace-separated ``--name[=value]``, a value may be quoted (``--f="a b"``), parsing
    stops at the first token that is not a flag, and the last value of a flag wins."""
    if value.strip() and not value.strip().startswith("-"):
        value = Path(value).read_text()
    flags: dict[str, str] = {}
    index = 0
    while True:
        while index < len(value) and value[index].isspace():
            index += 1
        if index >= len(value) or value[index] != "-":
            break
        end = index
        while end < len(value) and (value[end] in "-_" or value[end].isalnum()):
            end += 1
        name = value[index:end].lstrip("-")
        flag_value = ""
        if value.startswith("=", end):
            end += 1
            if end < len(value) and value[end] in "'\"":
                quote, end = value[end], end + 1
                closing = value.find(quote, end)
                closing = len(value) if closing < 0 else closing
                flag_value, end = value[end:closing], closing + 1
            else:
                start = end
                while end < len(value) and not value[end].isspace():
                    end += 1
                flag_value = value[start:end]
        flags.pop(name, None)  # re-inserted last: the order a reader sees is XLA's
        flags[name] = flag_value
        index = end
    return {
        name: flag_value
        for name, flag_value in flags.items()
        if not name.startswith(_OUTSIDE_PREFIXES) and name not in _OUTSIDE_NAMES
    }


def flag_file_lost(before_import: str | None, after_import: str | None) -> str | None:
    """Why a flag file given as XLA_FLAGS cannot reach XLA in this process, or None.

    torch_xla's ``__init__`` appends its default flags to XLA_FLAGS; on a value that names
    a file (no leading ``-``) that makes a file name XLA cannot open, and XLA aborts the
    process at the first device use (measured on stock 2.7.0)."""
    if not before_import or before_import.strip().startswith("-"):
        return None
    if after_import == before_import:
        return None
    return (
        f"torch_xla's import rewrote XLA_FLAGS from the file name {before_import!r} to "
        f"{after_import!r}, which XLA cannot open (it aborts): a flag file cannot reach XLA "
        "through this build"
    )


#: Switches torch_xla reads when it hands a module to the compiler (how, not what): the
#: compile side too (patch 0003 keys them next to the module).
COMPILE_SWITCHES = (
    "XLA_STABLEHLO_COMPILE",
    "CONVERT_SHLO_TO_SHARDY",
    "TPU_MEGACORE",
    "ENABLE_COLLECTIVE_MATMUL_IN_MP",
)


def compile_side(custom_options: dict[str, str]) -> dict[str, Any]:
    return {
        "switches": {name: os.environ[name] for name in COMPILE_SWITCHES if name in os.environ},
        "xla_flags": dict(sorted(parsed_flags(os.environ.get("XLA_FLAGS", "")).items())),
        "libtpu_init_args": dict(
            sorted(parsed_flags(os.environ.get("LIBTPU_INIT_ARGS", "")).items())
        ),
        "custom_compile_options": dict(sorted(custom_options.items())),
    }


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _graphs(torch: Any, device: Any) -> dict[str, Callable[[], Any]]:
    """Each graph's outputs, built from host tensors: only what is returned is pending
    when the graph is synced, so the lowered module is the program the sync compiles."""

    def cast() -> Any:
        x = torch.arange(1000, dtype=torch.int32).to(device).to(torch.float32)
        return (x * x).sum()

    def matmul() -> Any:
        a = torch.linspace(-1.0, 1.0, 64 * 64, dtype=torch.float32).reshape(64, 64)
        a = a.to(device)
        return a @ (a.t() * 0.37)

    def long() -> Any:
        z = torch.arange(1000, dtype=torch.int64).to(device)
        return (z * 3).sum()

    def gather() -> Any:
        source = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64).to(device)
        index = (torch.arange(64 * 8, dtype=torch.int64).reshape(64, 8) * 7 % 64).to(device)
        return torch.gather(source, 1, index)

    def scatter() -> Any:
        index = (torch.arange(64 * 8, dtype=torch.int64).reshape(64, 8) * 5 % 64).to(device)
        ones = torch.ones(64, 8, dtype=torch.float32).to(device)
        return torch.zeros(64, 64, dtype=torch.float32).to(device).scatter_add(1, index, ones)

    def scalars() -> Any:
        x = torch.linspace(0.0, 1.0, 256, dtype=torch.float32).to(device)
        return (x + 1) * 0 + x * 1

    made = {"cast": cast, "matmul": matmul, "long": long, "gather": gather}
    made.update({"scatter": scatter, "scalars": scalars})
    return made


def _setters(torch_xla: Any) -> dict[str, Callable[[str], None]]:
    """The Python setters a probe may call, by name, where the build has them."""
    found: dict[str, Callable[[str], None]] = {}
    backends = getattr(torch_xla, "backends", None)
    if backends is not None and hasattr(backends, "set_mat_mul_precision"):
        found["mat_mul_precision"] = backends.set_mat_mul_precision
    elif hasattr(torch_xla._XLAC, "_xla_set_mat_mul_precision"):
        found["mat_mul_precision"] = torch_xla._XLAC._xla_set_mat_mul_precision
    return found


#: Setter names the probe table may use (the table's test keeps them known).
SETTERS = ("mat_mul_precision",)


def run(args: argparse.Namespace) -> dict[str, Any]:
    began = time.perf_counter()
    xla_flags_given = os.environ.get("XLA_FLAGS")
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met

    canonical = _sibling("hlo_canonical")
    result: dict[str, Any] = {
        "torch_version": torch.__version__,
        "torch_xla_version": getattr(torch_xla, "__version__", "unknown"),
        "import_s": time.perf_counter() - began,
    }
    lost = flag_file_lost(xla_flags_given, os.environ.get("XLA_FLAGS"))
    if lost is not None:
        result["not_applicable"] = lost
        return result
    available = _setters(torch_xla)
    result["setters_available"] = sorted(available)
    for item in args.setter:
        name, _, value = item.partition("=")
        if name not in available:
            result["not_applicable"] = f"this build has no setter for {name}"
            return result
        available[name](value)
    options = dict(item.split("=", 1) for item in args.custom_compile_option)
    if options:
        setter = getattr(torch_xla, "set_custom_compile_options", None)
        if setter is None:
            result["not_applicable"] = (
                "this build has no torch_xla.set_custom_compile_options (added after 2.9.0)"
            )
            return result
        setter(options)
    side = compile_side(options)
    result["compile_side"] = side
    result["compile_side_digest"] = _digest(side)
    device = torch_xla.device()
    sync = getattr(torch_xla, "sync", None)
    if sync is None:
        import torch_xla.core.xla_model as xm

        sync = xm.mark_step
    rows = []
    for name, build in _graphs(torch, device).items():
        output = build()
        lowered_from = time.perf_counter()
        text = torch_xla._XLAC._get_xla_tensors_hlo([output])
        module = canonical.fingerprint(text)
        fingerprint_s = time.perf_counter() - lowered_from
        before = {counter: int(met.counter_value(counter) or 0) for counter in COUNTERS}
        compiles_before = _compiles(met)
        sync()
        values = output.cpu()
        after = {counter: int(met.counter_value(counter) or 0) for counter in COUNTERS}
        rows.append(
            {
                "graph": name,
                "module": module,
                "lower_and_fingerprint_s": round(fingerprint_s, 6),
                "hits": after["PersistentCacheHit"] - before["PersistentCacheHit"],
                "misses": after["PersistentCacheMiss"] - before["PersistentCacheMiss"],
                "deserialize_failures": after["PersistentCacheDeserializeFailure"]
                - before["PersistentCacheDeserializeFailure"],
                "compiles": _compiles(met) - compiles_before,
                "output_sha256": hashlib.sha256(values.float().numpy().tobytes()).hexdigest(),
            }
        )
        if args.keep_hlo:
            Path(args.keep_hlo, f"{name}.hlo.txt").write_text(text)
    result["graphs"] = rows
    return result


def _compiles(met: Any) -> int:
    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="JSON report path")
    parser.add_argument("--setter", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--custom-compile-option", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--keep-hlo", metavar="DIR", help="write each graph's HLO text there")
    args = parser.parse_args(argv)
    payload: dict[str, Any] = {"mode": "key-probe", "pid": os.getpid()}
    try:
        payload.update(run(args))
        payload["ok"] = True
        code = 0
    except BaseException as error:  # reported to the parent as data
        traceback.print_exc()  # into this child's log
        payload.update({"ok": False, "error": f"{type(error).__name__}: {error}"})
        code = 3
    _sibling("child_workload")._write(args.out, payload)  # by rename, as every child
    return code


if __name__ == "__main__":
    sys.exit(main())
