"""The canonical form of an HLO module's text, and its fingerprint.

Patch 0003 keys the persistent cache's disk entries on the lowered module instead of the
IR graph hash. Two lowerings of one program differ in what does not change the
executable: the module's name (the graph name; a ``functools.partial`` step carries a
memory address), computation and instruction names (numeric suffixes that follow what
the lowering emitted, and the graph name: ``SyncTensorsGraph`` when a step syncs,
``IrToHlo`` from ``_get_xla_tensors_hlo``), op metadata (source file and line, op
names) and, under ``XLA_HLO_DEBUG=1``, stack frame ids and the module's stack frame
index. The canonical form clears exactly those and keeps every other byte of the text:
shapes, element types, layouts,
``precision_config`` (``operand_precision=``), ``custom_call_target``,
``backend_config``, ``frontend_attributes``, ``sharding``, constants, the module header's
layout and aliasing.

The same rules are written in C++ in patch 0003 (``runtime/cache_key.cpp``,
``CanonicalHloText``); one table of cases
(``patches/torch_xla/checks/canonical_hlo_cases.toml``) runs through both: this module in
``tests/test_hlo_canonical.py``, the C++ in the compiled check ``cache_key_check``,
which also compares the C++ canonical text with this module's, case by case. Keep the two
in step: a rule changed here and not there fails that check.

The input is the text ``torch_xla._XLAC._get_xla_tensors_hlo(tensors)`` returns
(``runtime::util::GetComputationHloText``: OpenXLA's ``HloModule::ToString`` with
``HloPrintOptions()`` and operand shapes), whose names carry a ``%`` prefix. Rules:

- ``HloModule <name>`` becomes ``HloModule m``; the rest of the header line is kept.
- ``, metadata={...}`` is removed (braces matched, quoted strings skipped); the stack
  frame id lives inside it. The module's stack frame index (the ``FileNames``,
  ``FunctionNames``, ``FileLocations`` and ``StackFrames`` sections after the header) is
  removed.
- Every name is renamed ``n0``, ``n1``, ... in order of first appearance: ``%name``
  tokens and the parameter names of a computation's signature (``(p0.1: f32[2], ...)``).
  One map serves computations and instructions, so every reference follows its
  definition. Names inside quoted strings are not names and are never renamed, so two
  different strings never become equal.
- Blank lines and trailing whitespace are dropped.

Anything the rules do not recognise is kept as it is: a missed name can only make two
lowerings of one program differ (a needless miss), never make two programs equal.

Known limit of the *text* (not of these rules): ``HloPrintOptions()`` elides constants
with many elements as ``{...}``, so two texts from ``_get_xla_tensors_hlo`` that differ
only in such a constant's values are equal here. The C++ key prints the module with
``print_large_constants(true)`` before canonicalizing, so the disk key sees every value.
"""

from __future__ import annotations

import hashlib

#: Sections OpenXLA's ``HloModule::PrintStackFrameIndex`` prints after the header line
#: (only when op metadata is printed and the module has a stack frame index).
STACK_FRAME_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")

_METADATA = ", metadata={"
_HEADER = "HloModule "
#: XLA sanitises HLO names to these characters (``NameUniquer::GetSanitizedName``).
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def fingerprint(hlo_text: str) -> str:
    """``sha256:<64 hex>`` of the canonical text's UTF-8 bytes."""
    digest = hashlib.sha256(canonical_text(hlo_text).encode("utf-8")).hexdigest()
    return f"sha256:{digest}"


def canonical_text(hlo_text: str) -> str:
    """The module's text with names canonical and metadata and stack frames removed."""
    names: dict[str, str] = {}
    lines: list[str] = []
    depth = 0  # brace depth at the start of the line: 0 outside computations
    in_frame_index = False
    for raw in hlo_text.split("\n"):
        # Only spaces, tabs and carriage returns count as blank: the C++ rules strip the
        # same three, so both languages give one text for every input.
        line = raw.rstrip(" \t\r")
        stripped = line.strip(" \t\r")
        if depth == 0:
            # The stack frame index sits between the header and the first computation:
            # section titles, then numbered rows, separated by blank lines.
            if stripped in STACK_FRAME_SECTIONS:
                in_frame_index = True
                continue
            if in_frame_index:
                if not stripped or stripped[0] in "0123456789":
                    continue
                in_frame_index = False
        if not stripped:
            continue
        if depth == 0 and line.startswith(_HEADER):
            line = _canonical_header(line)
            signature = False
        else:
            # A line that starts outside every computation and is not the header opens a
            # computation: ``[ENTRY ]%name (p0.1: f32[2], ...) -> f32[2] {``.
            signature = depth == 0
        line, depth = _rename(line, depth, signature, names)
        lines.append(line)
    return "".join(line + "\n" for line in lines)


def _canonical_header(line: str) -> str:
    end = len(_HEADER)
    while end < len(line) and line[end] in _NAME_CHARS:
        end += 1
    return _HEADER + "m" + line[end:]


def _canonical_name(name: str, names: dict[str, str]) -> str:
    if name not in names:
        names[name] = f"n{len(names)}"
    return names[name]


def _skip_braces(line: str, start: int) -> int:
    """The index after the brace that closes the one at ``start`` (quoted strings skipped)."""
    depth = 0
    i = start
    in_string = False
    while i < len(line):
        c = line[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    # Unbalanced (not text XLA prints): drop the rest of the line, as the attribute runs on.
    return len(line)


def _string_end(line: str, start: int) -> int:
    """The index after the string opening at ``start`` (its closing quote; escapes are
    skipped), or the line's end when it does not close."""
    i = start + 1
    while i < len(line):
        if line[i] == "\\":
            i += 2
        elif line[i] == '"':
            return i + 1
        else:
            i += 1
    return len(line)


def _name_end(line: str, start: int) -> int:
    """The index after the run of name characters from ``start``."""
    end = start
    while end < len(line) and line[end] in _NAME_CHARS:
        end += 1
    return end


def _rename(line: str, depth: int, signature: bool, names: dict[str, str]) -> tuple[str, int]:
    """Rename names and drop metadata in one line; returns it and the brace depth after it.

    ``signature``: the line opens a computation, so the first parenthesised list at brace
    depth 0 is its parameter list, whose items are ``name: shape``.
    """
    out: list[str] = []
    i = 0
    paren = 0  # parenthesis depth inside the signature
    nest = 0  # brackets and braces inside the signature (shapes, layouts)
    in_signature = False
    signature_done = not signature
    item_start = False
    while i < len(line):
        c = line[i]
        if line.startswith(_METADATA, i):
            i = _skip_braces(line, i + len(_METADATA) - 1)
            continue
        if c == '"':  # a string is copied as it is
            end = _string_end(line, i)
            out.append(line[i:end])
            i = end
            continue
        if item_start and c in _NAME_CHARS:
            end = _name_end(line, i)
            item_start = False
            if line.startswith(":", end):
                out.append(_canonical_name(line[i:end], names))
            else:
                out.append(line[i:end])
            i = end
            continue
        item_start = False
        if c == "%":
            end = _name_end(line, i + 1)
            if end > i + 1:
                out.append("%" + _canonical_name(line[i + 1 : end], names))
                i = end
                continue
        if in_signature:
            if c == "(":
                paren += 1
            elif c == ")":
                paren -= 1
                if paren == 0:
                    in_signature = False
                    signature_done = True
            elif c in "[{":
                nest += 1
            elif c in "]}":
                nest -= 1
            elif c == "," and paren == 1 and nest == 0 and line.startswith(" ", i + 1):
                out.append(", ")
                i += 2
                item_start = True
                continue
        elif not signature_done and depth == 0 and c == "(":
            in_signature = True
            paren = 1
            item_start = True
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        out.append(c)
        i += 1
    return "".join(out), depth
