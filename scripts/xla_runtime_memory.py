#!/usr/bin/env python3
"""Per-device memory (HBM) use of the physical XLA runtime devices, also under SPMD.

Training code::

    from xla_runtime_memory import runtime_memory_info

    for dev in runtime_memory_info():          # one DeviceMemory per local chip
        print(dev.device, f"{dev.fraction_used:.0%}", dev.gib_peak)

Command line (on a training host, with the same environment variables as training)::

    PJRT_DEVICE=TPU python scripts/xla_runtime_memory.py [--json]

The numbers come from ``torch_xla._XLAC._xla_runtime_memory_info(device_str)``, a binding
that only exists in torch_xla builds carrying the pipeline's patch
``patches/torch_xla/0002-runtime-memory-info-binding.patch``. Stock torch_xla only has
``_xla_memory_info``, which parses its argument as a lazy-tensor device and therefore sees
nothing but the virtual ``SPMD:0`` once SPMD is on. Without the binding this module raises
:class:`RuntimeMemoryInfoUnavailable` naming that patch, instead of failing somewhere
less obvious.

Self-contained on purpose: it imports only the standard library, and torch_xla lazily,
so it can be copied next to training code and needs nothing from the pipeline package.
Importing torch_xla is deferred to the first query because the runtime reads its
environment (PJRT_DEVICE, cache path, ...) at import time and training code sets that
environment first.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

PATCH_FILE = "0002-runtime-memory-info-binding.patch"
PATCH_PATH = f"patches/torch_xla/{PATCH_FILE}"
BINDING = "_xla_runtime_memory_info"
KEYS = ("bytes_used", "bytes_limit", "peak_bytes_used")
GIB = 1024**3

# Exit codes of the command line: distinct so that scripts can tell "wrong build" from
# "this device keeps no statistics".
EXIT_OK = 0
EXIT_QUERY_FAILED = 1
EXIT_BINDING_MISSING = 2


class RuntimeMemoryInfoUnavailable(RuntimeError):
    """The installed torch_xla has no ``_xla_runtime_memory_info`` (patch 0002 missing)."""


@dataclass(frozen=True)
class DeviceMemory:
    """Memory use of one physical runtime device, in bytes, as the PJRT allocator reports it."""

    device: str
    bytes_used: int
    bytes_limit: int
    peak_bytes_used: int

    @classmethod
    def from_mapping(cls, device: str, info: Mapping[str, Any]) -> DeviceMemory:
        """Build from the dict the binding returns; a missing key or a non-int is an error."""
        missing = [key for key in KEYS if key not in info]
        if missing:
            raise ValueError(
                f"{BINDING}({device!r}) returned {sorted(info)}; missing {missing}. "
                f"The binding does not match {PATCH_FILE}."
            )
        values: dict[str, int] = {}
        for key in KEYS:
            value = info[key]
            # bool is an int subclass but never a byte count.
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{BINDING}({device!r})[{key!r}] is {value!r}, not an int")
            values[key] = value
        return cls(device=device, **values)

    @property
    def bytes_free(self) -> int:
        """Bytes still allocatable under the limit (never negative)."""
        return max(self.bytes_limit - self.bytes_used, 0)

    @property
    def fraction_used(self) -> float:
        """bytes_used / bytes_limit; NaN when the device reports no positive limit."""
        return self.bytes_used / self.bytes_limit if self.bytes_limit > 0 else math.nan

    @property
    def peak_fraction_used(self) -> float:
        """peak_bytes_used / bytes_limit; NaN when the device reports no positive limit."""
        return self.peak_bytes_used / self.bytes_limit if self.bytes_limit > 0 else math.nan

    @property
    def gib_used(self) -> float:
        return self.bytes_used / GIB

    @property
    def gib_limit(self) -> float:
        return self.bytes_limit / GIB

    @property
    def gib_peak(self) -> float:
        return self.peak_bytes_used / GIB


def _load_xlac() -> Any:
    """Import torch_xla now (not at module import) and return its ``_XLAC`` extension."""
    torch_xla = importlib.import_module("torch_xla")
    return torch_xla._XLAC


def _describe_torch_xla() -> str:
    """'torch_xla <version> (<path>)' for error messages; best effort."""
    module = sys.modules.get("torch_xla")
    if module is None:
        return "the installed torch_xla"
    version = getattr(module, "__version__", "unknown version")
    return f"torch_xla {version} ({getattr(module, '__file__', 'unknown path')})"


def _binding(xlac: Any) -> Callable[[str], Mapping[str, Any]]:
    binding = getattr(xlac, BINDING, None)
    if binding is None:
        raise RuntimeMemoryInfoUnavailable(
            f"{_describe_torch_xla()} has no torch_xla._XLAC.{BINDING}: it was built without "
            f"the patch {PATCH_PATH}. Install a torch_xla wheel built by the xla-wheels "
            "pipeline with that patch in its series (stock PyPI wheels do not have it). "
            "torch_xla._XLAC._xla_memory_info cannot replace it under SPMD, where it only "
            "knows the virtual SPMD:0 device."
        )
    return binding


def runtime_devices(xlac: Any | None = None) -> list[str]:
    """The physical runtime devices this process can query, in runtime order.

    ``_xla_get_all_runtime_devices()`` lists every device of the job; on a multi-host
    slice the other hosts' devices are in it too, but allocator statistics exist only for
    local (addressable) devices, which ``_xla_get_runtime_devices()`` lists.
    """
    xlac = _load_xlac() if xlac is None else xlac
    all_devices = [str(device) for device in xlac._xla_get_all_runtime_devices()]
    get_local = getattr(xlac, "_xla_get_runtime_devices", None)
    if get_local is None:
        return all_devices
    local = {str(device) for device in get_local()}
    return [device for device in all_devices if device in local]


def runtime_memory_info(
    devices: Sequence[str] | None = None, *, xlac: Any | None = None
) -> list[DeviceMemory]:
    """Query each device (default: all local runtime devices) through the patched binding.

    Raises RuntimeMemoryInfoUnavailable when the binding is absent (checked before the
    runtime is touched), ValueError for a device string the runtime does not know (the
    binding lists the valid ones), and RuntimeError for a device whose client keeps no
    allocator statistics (the CPU client).
    """
    xlac = _load_xlac() if xlac is None else xlac
    query = _binding(xlac)
    names = list(devices) if devices is not None else runtime_devices(xlac)
    return [DeviceMemory.from_mapping(name, query(name)) for name in names]


def _format_table(rows: Sequence[DeviceMemory]) -> str:
    header = f"{'device':<10} {'used GiB':>10} {'limit GiB':>10} {'used':>7} {'peak GiB':>10}"
    lines = [header, "-" * len(header)]
    for row in rows:
        used = "n/a" if math.isnan(row.fraction_used) else f"{row.fraction_used:.1%}"
        lines.append(
            f"{row.device:<10} {row.gib_used:>10.2f} {row.gib_limit:>10.2f} {used:>7} "
            f"{row.gib_peak:>10.2f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Print per-device memory use of the local XLA runtime devices "
        f"(needs torch_xla with {PATCH_FILE}). Set PJRT_DEVICE etc. as for training."
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list instead")
    parser.add_argument(
        "devices", nargs="*", help="runtime device strings (default: all local ones)"
    )
    args = parser.parse_args(argv)
    try:
        rows = runtime_memory_info(args.devices or None)
    except RuntimeMemoryInfoUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BINDING_MISSING
    except ImportError as error:
        print(f"error: cannot import torch_xla: {error}", file=sys.stderr)
        return EXIT_QUERY_FAILED
    except (RuntimeError, ValueError) as error:
        print(f"error: memory query failed: {error}", file=sys.stderr)
        return EXIT_QUERY_FAILED
    if args.json:
        print(json.dumps([asdict(row) for row in rows], indent=2))
    else:
        print(_format_table(rows))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
