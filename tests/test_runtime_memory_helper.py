"""scripts/xla_runtime_memory.py: against real stock torch_xla 2.9.0, plus unit tests.

The stock-wheel tests run the helper in a subprocess with the interpreter of the cached
torch_xla 2.9.0 environment (fixture ``stock_xla_python_29`` in conftest.py), on CPU.
Stock 2.9.0 has no ``_xla_runtime_memory_info``, so the helper must refuse with its own
exception and name the missing patch.

The unit tests further down inject a stand-in for ``torch_xla._XLAC`` (clearly a fake,
``FakeXLAC``) to test only how the helper turns the binding's dicts into typed results;
they say nothing about torch_xla itself.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.gitrepos import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "xla_runtime_memory.py"
PATCH_FILE = "0002-runtime-memory-info-binding.patch"


def _load_helper() -> ModuleType:
    spec = importlib.util.spec_from_file_location("xla_runtime_memory", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


helper = _load_helper()


# --- Real stock torch_xla 2.9.0 on CPU --------------------------------------------------------


def _run_stock(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": "/nonexistent",
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": "2",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return subprocess.run(
        [str(python), *args],
        cwd=REPO_ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=600,
        check=False,
    )


PROBE = f"""
import json, sys
sys.path.insert(0, {str(SCRIPT.parent)!r})
import xla_runtime_memory as m
out = {{}}
try:
    m.runtime_memory_info()
except m.RuntimeMemoryInfoUnavailable as error:
    out["error"] = str(error)
import torch_xla
out["version"] = torch_xla.__version__
out["has_memory_info"] = hasattr(torch_xla._XLAC, "_xla_memory_info")
out["devices"] = m.runtime_devices()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_stock_29_raises_the_specific_error_naming_patch_0002(stock_xla_python_29: Path) -> None:
    result = _run_stock(stock_xla_python_29, "-c", PROBE)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    # It really was stock 2.9.0 (the old binding is there, the new one is not).
    assert out["version"].startswith("2.9.0")
    assert out["has_memory_info"] is True
    assert "error" in out, "stock torch_xla 2.9.0 unexpectedly has the binding"
    assert PATCH_FILE in out["error"]
    assert "_xla_runtime_memory_info" in out["error"]
    assert "torch_xla 2.9.0" in out["error"]
    # Enumeration uses calls stock torch_xla already has.
    assert out["devices"] == ["CPU:0", "CPU:1"]


@pytest.mark.slow
def test_stock_29_command_line_exits_2_with_the_message(stock_xla_python_29: Path) -> None:
    result = _run_stock(stock_xla_python_29, str(SCRIPT))
    assert result.returncode == helper.EXIT_BINDING_MISSING, result.stderr[-3000:]
    assert PATCH_FILE in result.stderr
    assert result.stdout == ""


# --- Self-containment -----------------------------------------------------------------------


def test_helper_imports_only_the_standard_library() -> None:
    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported, "no imports found: the check is not looking at the file"
    # torch_xla is imported lazily by name (importlib), after the caller set its env.
    outside = {name for name in imported if name not in sys.stdlib_module_names}
    assert not outside, outside
    assert "xla_wheels" not in SCRIPT.read_text(encoding="utf-8")


# --- Unit tests with an injected fake _XLAC (not torch_xla) ----------------------------------


class FakeXLAC:
    """Stand-in for torch_xla._XLAC: only the three functions the helper calls."""

    def __init__(
        self,
        stats: dict[str, dict[str, Any]],
        local: list[str] | None = None,
        with_binding: bool = True,
    ) -> None:
        self._stats = stats
        self._local = list(stats) if local is None else local
        self.calls: list[str] = []
        if with_binding:
            self._xla_runtime_memory_info = self._query

    def _xla_get_all_runtime_devices(self) -> list[str]:
        self.calls.append("all")
        return list(self._stats)

    def _xla_get_runtime_devices(self) -> list[str]:
        self.calls.append("local")
        return self._local

    def _query(self, device: str) -> dict[str, Any]:
        self.calls.append(device)
        if device not in self._stats:
            raise ValueError(f"Unknown runtime device: '{device}'")
        return self._stats[device]


GIB = 1024**3
STATS = {
    "TPU:0": {"bytes_used": 8 * GIB, "bytes_limit": 32 * GIB, "peak_bytes_used": 12 * GIB},
    "TPU:1": {"bytes_used": 16 * GIB, "bytes_limit": 32 * GIB, "peak_bytes_used": 20 * GIB},
    "TPU:2": {"bytes_used": 0, "bytes_limit": 32 * GIB, "peak_bytes_used": 0},
}


def test_fake_results_are_typed_and_in_runtime_order() -> None:
    rows = helper.runtime_memory_info(xlac=FakeXLAC(STATS))
    assert [row.device for row in rows] == ["TPU:0", "TPU:1", "TPU:2"]
    first = rows[0]
    assert isinstance(first, helper.DeviceMemory)
    assert (first.bytes_used, first.bytes_limit, first.peak_bytes_used) == (
        8 * GIB,
        32 * GIB,
        12 * GIB,
    )
    assert first.fraction_used == 0.25
    assert first.peak_fraction_used == 0.375
    assert first.bytes_free == 24 * GIB
    assert (first.gib_used, first.gib_limit, first.gib_peak) == (8.0, 32.0, 12.0)
    with pytest.raises(AttributeError):
        first.bytes_used = 0  # frozen


def test_fake_other_hosts_devices_are_not_queried() -> None:
    fake = FakeXLAC(STATS, local=["TPU:1"])
    rows = helper.runtime_memory_info(xlac=fake)
    assert [row.device for row in rows] == ["TPU:1"]
    assert "TPU:0" not in fake.calls


def test_fake_missing_binding_is_reported_before_the_runtime_is_touched() -> None:
    fake = FakeXLAC(STATS, with_binding=False)
    with pytest.raises(helper.RuntimeMemoryInfoUnavailable) as error:
        helper.runtime_memory_info(xlac=fake)
    assert PATCH_FILE in str(error.value)
    assert fake.calls == []
    assert issubclass(helper.RuntimeMemoryInfoUnavailable, RuntimeError)


def test_fake_explicit_devices_and_unknown_device_error_passes_through() -> None:
    rows = helper.runtime_memory_info(["TPU:2"], xlac=FakeXLAC(STATS))
    assert [row.device for row in rows] == ["TPU:2"]
    with pytest.raises(ValueError, match="Unknown runtime device"):
        helper.runtime_memory_info(["SPMD:0"], xlac=FakeXLAC(STATS))


@pytest.mark.parametrize(
    ("info", "message"),
    [
        ({"bytes_used": 1, "bytes_limit": 2}, "missing"),
        ({"bytes_used": 1, "bytes_limit": "2", "peak_bytes_used": 1}, "not an int"),
        ({"bytes_used": True, "bytes_limit": 2, "peak_bytes_used": 1}, "not an int"),
    ],
)
def test_malformed_dicts_are_rejected(info: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        helper.DeviceMemory.from_mapping("TPU:0", info)


def test_no_limit_gives_nan_fractions_not_a_division_error() -> None:
    row = helper.DeviceMemory("X:0", bytes_used=5, bytes_limit=0, peak_bytes_used=7)
    assert math.isnan(row.fraction_used) and math.isnan(row.peak_fraction_used)
    assert row.bytes_free == 0


def test_fake_command_line_table_json_and_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(helper, "_load_xlac", lambda: FakeXLAC(STATS))
    assert helper.main([]) == helper.EXIT_OK
    table = capsys.readouterr().out
    assert "TPU:1" in table and "50.0%" in table

    assert helper.main(["--json"]) == helper.EXIT_OK
    rows = json.loads(capsys.readouterr().out)
    assert rows[0] == {"device": "TPU:0", **STATS["TPU:0"]}

    assert helper.main(["SPMD:0"]) == helper.EXIT_QUERY_FAILED
    assert "Unknown runtime device" in capsys.readouterr().err

    monkeypatch.setattr(helper, "_load_xlac", lambda: FakeXLAC(STATS, with_binding=False))
    assert helper.main([]) == helper.EXIT_BINDING_MISSING
    assert PATCH_FILE in capsys.readouterr().err
