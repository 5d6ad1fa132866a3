"""Canonical HLO text and its fingerprint: one program, one fingerprint.

Provisional rules (the series' table of cases replaces this module): the module name,
computation names and instruction names are renamed in order of first appearance, and
``metadata={...}`` is dropped; everything else (shapes, element types, precision, layouts,
attributes) is kept.
"""

from __future__ import annotations

import hashlib
import re

_NAME = re.compile(r"%?[A-Za-z_][\w\-]*\.\d+(?:\.\d+)*")
_MODULE = re.compile(r"^HloModule\s+[^\s,]+")


def _drop_metadata(text: str) -> str:
    out = []
    index = 0
    while True:
        start = text.find(", metadata={", index)
        if start < 0:
            out.append(text[index:])
            return "".join(out)
        out.append(text[index:start])
        depth = 0
        cursor = start + len(", metadata=")
        while cursor < len(text):
            if text[cursor] == "{":
                depth += 1
            elif text[cursor] == "}":
                depth -= 1
                if depth == 0:
                    cursor += 1
                    break
            cursor += 1
        index = cursor


def canonical_text(hlo_text: str) -> str:
    text = _MODULE.sub("HloModule m", _drop_metadata(hlo_text).strip(), count=1)
    names: dict[str, str] = {}

    def rename(match: re.Match[str]) -> str:
        token = match.group(0)
        bare = token.lstrip("%")
        if bare not in names:
            names[bare] = f"n{len(names)}"
        return ("%" if token.startswith("%") else "") + names[bare]

    return _NAME.sub(rename, text) + "\n"


def fingerprint(hlo_text: str) -> str:
    return "sha256:" + hashlib.sha256(canonical_text(hlo_text).encode()).hexdigest()
