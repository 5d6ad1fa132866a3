"""C++ names for people: binutils' ``c++filt``, one process for every name.

Demangling only changes what is printed: the comparison works on mangled names, which are
what the dynamic linker reports. Without ``c++filt`` (binutils not installed) the names
stay mangled and the report says so.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

from xla_wheels import runner


def demangler() -> str | None:
    return shutil.which("c++filt")


def demangle(names: Sequence[str]) -> dict[str, str]:
    """mangled -> demangled for each name (itself when c++filt is absent or fails)."""
    program = demangler()
    if program is None or not names:
        return {name: name for name in names}
    try:
        result = runner.run([program], echo="none", input_text="\n".join(names) + "\n", timeout=120)
    except (OSError, runner.StepTimedOut):
        return {name: name for name in names}
    lines = result.stdout.splitlines()
    if result.returncode != 0 or len(lines) != len(names):
        return {name: name for name in names}
    return dict(zip(names, lines, strict=True))
