"""The pure comparison: which imports of ``_XLAC`` the paired torch does not export.

Data in, verdict out, no I/O (like ``gate/restart.py``). The rules are the dynamic
linker's, reduced to what decides ``undefined symbol`` at import:

- Only strong references count. A weak undefined symbol that no object defines is bound
  to 0 and the import succeeds, so it is never "missing".
- A versioned reference (``name@V``, recorded with the library file that must define
  ``V``) belongs to that file. References versioned against a library that is not
  torch's (``libc.so.6``, ``libstdc++.so.6``, ...) are outside this check; one versioned
  against a torch library needs a definition of exactly ``name@V`` there.
- An unversioned reference is satisfied by a default-version or unversioned definition
  (``name`` or ``name@@V``); a hidden ``name@V`` definition does not satisfy it.
- A definition counts only when other objects can bind to it: global, weak or unique
  binding with default or protected visibility.
- The Python C API (names starting ``Py`` or ``_Py``, reserved to CPython by PEP 7) comes
  from the interpreter that loads the extension, not from torch: those unversioned
  references are attributed to it and not checked here.
- torch's libraries are every library the loader maps for ``_XLAC`` from its
  environment, breadth first through the DT_NEEDED of each (``libc10.so``, ``libtorch.so``
  ... and what they need in turn: ``libtorch_cuda.so``, ``libc10_cuda.so`` of a CUDA
  torch), found as ``ld.so`` finds them (:func:`xla_wheels.abi.pairs.load_order`): a
  symbol one of them defines binds at import, whichever asked for the library.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from xla_wheels.abi.elf import SharedObject

VISIBLE = frozenset({"STV_DEFAULT", "STV_PROTECTED"})
PYTHON_PROVIDER = "the Python interpreter"
UNKNOWN_LIBRARY = "(library unknown)"
_PYTHON_PREFIXES = ("Py", "_Py")


@dataclass(frozen=True)
class MissingSymbol:
    name: str
    """The mangled name, as the dynamic linker reports it."""
    version: str | None = None


@dataclass(frozen=True)
class Comparison:
    torch_libraries: tuple[str, ...]
    """The torch libraries the extension needs that were searched, in DT_NEEDED order."""
    checked: int
    """Strong references the torch libraries must satisfy."""
    missing: tuple[MissingSymbol, ...]
    elsewhere: tuple[tuple[str, int], ...]
    """(provider, count) of strong references that are other libraries' business."""
    weak_ignored: int

    @property
    def ok(self) -> bool:
        return not self.missing


def _index(libraries: Sequence[SharedObject]) -> tuple[set[str], dict[str, set[str]]]:
    """(names an unversioned reference binds to, name -> versions a ``name@V`` binds to)."""
    unversioned: set[str] = set()
    versioned: dict[str, set[str]] = defaultdict(set)
    for library in libraries:
        for export in library.exports:
            if export.visibility not in VISIBLE:
                continue
            if export.version is not None:
                versioned[f"{library.name}\0{export.name}"].add(export.version)
            if not export.hidden_version:
                unversioned.add(export.name)
    return unversioned, versioned


def compare(
    extension: SharedObject,
    torch_libraries: Sequence[SharedObject],
    mapped: Sequence[str] | None = None,
) -> Comparison:
    """Every strong reference of ``extension`` owed by torch that torch does not define.

    ``mapped``: the names of every library the loader maps, when only some of them
    (``torch_libraries``) were read for their symbols; a reference versioned against a
    mapped library is torch's to satisfy whether or not that library was read yet."""
    unversioned, versioned = _index(torch_libraries)
    names = tuple(library.name for library in torch_libraries) if mapped is None else mapped
    torch_names = set(names)
    elsewhere: dict[str, int] = defaultdict(int)
    missing: list[MissingSymbol] = []
    checked = weak = 0
    for reference in extension.imports:
        if reference.weak:
            weak += 1
            continue
        if reference.version_file is not None and reference.version_file not in torch_names:
            elsewhere[reference.version_file] += 1
            continue
        if reference.version is None and reference.name.startswith(_PYTHON_PREFIXES):
            elsewhere[PYTHON_PROVIDER] += 1
            continue
        checked += 1
        if reference.version is None:
            found = reference.name in unversioned
        else:
            key = f"{reference.version_file}\0{reference.name}"
            found = reference.version in versioned.get(key, set())
        if not found:
            missing.append(MissingSymbol(reference.name, reference.version))
    return Comparison(
        torch_libraries=tuple(names),
        checked=checked,
        missing=tuple(sorted(set(missing), key=lambda m: m.name)),
        elsewhere=tuple(sorted(elsewhere.items())),
        weak_ignored=weak,
    )


# --- grouping -------------------------------------------------------------------------


def scope_of(demangled: str) -> str:
    """The class or namespace a demangled C++ name is declared in (``c10::SymInt``).

    The qualified name ends at the first ``(`` outside template brackets; its scope is
    everything before the last ``::`` outside template brackets. C names have none.
    """
    depth = 0
    end = len(demangled)
    last_sep = -1
    i = 0
    while i < len(demangled):
        char = demangled[i]
        if char == "<":
            depth += 1
        elif char == ">":
            depth = max(0, depth - 1)
        elif depth == 0 and char == "(" and not demangled.startswith("operator()", i - 8):
            end = i
            break
        elif depth == 0 and demangled.startswith("::", i):
            last_sep = i
            i += 1
        i += 1
    if last_sep < 0 or last_sep > end:
        return "(global)"
    head = demangled[:last_sep]
    # "vtable for c10::X" / "typeinfo for ...": the scope of the thing named.
    for prefix in ("vtable for ", "typeinfo for ", "typeinfo name for ", "VTT for "):
        if head.startswith(prefix):
            return demangled[len(prefix) :].split("<")[0]
    return head.split(" ")[-1] if " " in head.split("<")[0] else head


def mangled_scope(name: str) -> str | None:
    """The nested-name prefix of an Itanium-mangled member name (``3c106SymInt``).

    ``_ZN[K|V|r...]<len><id>...<len><id>E...``: every ``<len><id>`` but the last. None for
    names this simple reading does not cover (templates, substitutions, C names).
    """
    if not name.startswith("_ZN"):
        return None
    i = 3
    while i < len(name) and name[i] in "KVrRO":
        i += 1
    parts: list[str] = []
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        length = int(name[i:j])
        parts.append(name[i : j + length])
        i = j + length
    return "".join(parts[:-1]) if len(parts) > 1 else None


def scope_homes(torch_libraries: Sequence[SharedObject]) -> dict[str, str]:
    """Mangled scope -> the torch library that exports the most members of it."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for library in torch_libraries:
        for export in library.exports:
            scope = mangled_scope(export.name)
            if scope is not None:
                counts[scope][library.name] += 1
    return {
        scope: max(per_library.items(), key=lambda item: (item[1], item[0]))[0]
        for scope, per_library in counts.items()
    }


@dataclass(frozen=True)
class SymbolGroup:
    library: str
    """The torch library that holds the symbol's class/namespace (where it belongs)."""
    scope: str
    symbols: tuple[tuple[str, str], ...]
    """(demangled, mangled), sorted; a versioned reference ends in ``@VERSION``."""


def group_missing(
    missing: Sequence[MissingSymbol],
    demangled: Mapping[str, str],
    torch_libraries: Sequence[SharedObject],
) -> tuple[SymbolGroup, ...]:
    """Missing symbols grouped by (library of their scope, scope), both sorted."""
    homes = scope_homes(torch_libraries)
    groups: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for symbol in missing:
        readable = demangled.get(symbol.name, symbol.name)
        home = homes.get(mangled_scope(symbol.name) or "", UNKNOWN_LIBRARY)
        key = (home, scope_of(readable))
        # A versioned reference is missing as name@VERSION (the name alone may be there).
        suffix = f"@{symbol.version}" if symbol.version else ""
        groups[key].append((readable + suffix, symbol.name + suffix))
    return tuple(
        SymbolGroup(library, scope, tuple(sorted(symbols)))
        for (library, scope), symbols in sorted(groups.items())
    )
