"""The canonical HLO rules in Python, over the one table of cases both languages run.

The C++ rules of patch 0003 run the same table in the compiled check
``cache_key_check`` (tests/test_torch_xla_patches.py), which also compares its canonical
text with this module's, case by case.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from xla_host.gate.hlo_canonical import canonical_text, fingerprint

CASES_FILE = (
    Path(__file__).resolve().parent.parent
    / "patches"
    / "torch_xla"
    / "checks"
    / "canonical_hlo_cases.toml"
)


def _cases() -> list[dict[str, Any]]:
    return list(tomllib.loads(CASES_FILE.read_text(encoding="utf-8"))["case"])


CASES = _cases()


def test_the_table_has_both_kinds_of_case_each_named_once_and_explained():
    names = [case["name"] for case in CASES]
    assert len(names) == len(set(names))
    assert {case["expect"] for case in CASES} == {"equal", "different"}
    for case in CASES:
        assert case["why"].strip(), case["name"]
        assert set(case) == {"name", "expect", "why", "a", "b"}, case["name"]


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_case_of_the_table(case: dict[str, Any]):
    equal = fingerprint(case["a"]) == fingerprint(case["b"])
    if case["expect"] == "equal":
        assert equal, (canonical_text(case["a"]), canonical_text(case["b"]))
    else:
        assert not equal, canonical_text(case["a"])


def test_fingerprint_is_the_sha256_of_the_canonical_text():
    text = CASES[0]["a"]
    value = fingerprint(text)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", value)
    assert value == "sha256:" + hashlib.sha256(canonical_text(text).encode()).hexdigest()


def test_canonical_text_of_a_debug_module():
    # XLA_HLO_DEBUG=1 text: names, metadata, stack frame index; the exact result pins the
    # rules (the C++ check compares its own text with this module's for every case).
    text = (
        "HloModule SyncTensorsGraph.12, entry_computation_layout={(f32[2]{0})->(f32[2]{0})}\n"
        "\n"
        "FileNames\n"
        '1 "/tmp/x.py"\n'
        "\n"
        "StackFrames\n"
        "1 {file_location_id=1 parent_frame_id=1}\n"
        "\n"
        "\n"
        "%Body.3 (a.4: f32[]) -> f32[] {\n"
        '  ROOT %a.4 = f32[] parameter(0), metadata={op_name="x" stack_frame_id=1}\n'
        "}\n"
        "\n"
        "ENTRY %SyncTensorsGraph.12 (p0.1: f32[2]) -> (f32[2]) {\n"
        '  %p0.1 = f32[2]{0} parameter(0), metadata={op_type="xla__device_data" '
        'source_file="/tmp/x.py" source_line=3 stack_frame_id=1}\n'
        '  %c.2 = f32[2]{0} custom-call(f32[2]{0} %p0.1), custom_call_target="k", '
        'backend_config="%keep", frontend_attributes={a="1"}, sharding={replicated}\n'
        "  ROOT %tuple.5 = (f32[2]{0}) tuple(f32[2]{0} %c.2)\n"
        "}\n"
    )
    assert canonical_text(text) == (
        "HloModule m, entry_computation_layout={(f32[2]{0})->(f32[2]{0})}\n"
        "%n0 (n1: f32[]) -> f32[] {\n"
        "  ROOT %n1 = f32[] parameter(0)\n"
        "}\n"
        "ENTRY %n2 (n3: f32[2]) -> (f32[2]) {\n"
        "  %n3 = f32[2]{0} parameter(0)\n"
        '  %n4 = f32[2]{0} custom-call(f32[2]{0} %n3), custom_call_target="k", '
        'backend_config="%keep", frontend_attributes={a="1"}, sharding={replicated}\n'
        "  ROOT %n5 = (f32[2]{0}) tuple(f32[2]{0} %n4)\n"
        "}\n"
    )
