"""The ELF reader: what a shared object needs, imports and exports (pyelftools).

Only the dynamic symbol table (``.dynsym``) matters to the dynamic linker, so only it is
read. Symbol versions come from ``.gnu.version`` (one index per symbol),
``.gnu.version_r`` (the versions this object requires, each naming the library file that
must define it) and ``.gnu.version_d`` (the versions this object defines). A reference
``name@V`` that requires version ``V`` of ``libc.so.6`` is bound to that file; an
unversioned reference may be satisfied by any loaded object.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xla_host.errors import ExitCode, PipelineError

if TYPE_CHECKING:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

# pyelftools is imported in the functions that read a file, not at the top: it took
# 20-40 ms of the start of every build command (python -X importtime), through the ship
# check the build stage imports, and only a build or an ABI check reads an ELF file.

#: Bindings under which a defined symbol is visible to other objects (GNU_UNIQUE is
#: reported by pyelftools as ``STB_LOOS``, the value it shares with STB_GNU_UNIQUE).
EXPORTING_BINDINGS = frozenset({"STB_GLOBAL", "STB_WEAK", "STB_LOOS", "STB_GNU_UNIQUE"})
#: ``.gnu.version`` index 0 is "local", 1 is "global, unversioned"; bit 15 marks a hidden
#: (non-default, ``name@V`` rather than ``name@@V``) definition.
_VERSYM_HIDDEN = 0x8000
_SPECIAL_INDEX = {"VER_NDX_LOCAL": 0, "VER_NDX_GLOBAL": 1}
_VER_NDX_LORESERVE = 0xFF00


class ElfReadError(PipelineError):
    """A file given as a shared library is not one pyelftools can read."""

    exit_code = ExitCode.BAD_INPUT


@dataclass(frozen=True)
class Import:
    """An undefined dynamic symbol: the object expects another one to define it."""

    name: str
    weak: bool
    """A weak reference may stay unresolved: the loader binds it to 0 instead of failing."""
    version: str | None = None
    """The required version (``GLIBC_2.2.5``), None for an unversioned reference."""
    version_file: str | None = None
    """The library the version requirement names (``libc.so.6``)."""


@dataclass(frozen=True)
class Export:
    """A defined dynamic symbol."""

    name: str
    binding: str
    visibility: str
    """``STV_DEFAULT``, ``STV_PROTECTED`` (both visible to others), ``STV_HIDDEN``, ..."""
    version: str | None = None
    hidden_version: bool = False
    """Defined as ``name@V`` (not the default ``name@@V``): only ``name@V`` references bind."""


@dataclass(frozen=True)
class SharedObject:
    path: Path
    soname: str | None
    needed: tuple[str, ...]
    imports: tuple[Import, ...]
    exports: tuple[Export, ...]
    rpath: tuple[str, ...] = ()
    """DT_RPATH entries as written (``$ORIGIN/...``); the loader ignores them when the
    object has a DT_RUNPATH."""
    runpath: tuple[str, ...] = ()
    """DT_RUNPATH entries as written: searched for this object's own DT_NEEDED only."""

    @property
    def name(self) -> str:
        return self.soname or self.path.name


def _version_tables(elf: ELFFile) -> tuple[dict[int, tuple[str, str | None]], dict[int, str]]:
    """(index -> (required version, its file)), (index -> defined version name)."""
    from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

    needed: dict[int, tuple[str, str | None]] = {}
    defined: dict[int, str] = {}
    for section in elf.iter_sections():
        if isinstance(section, GNUVerNeedSection):
            for verneed, auxiliaries in section.iter_versions():
                for aux in auxiliaries:
                    needed[aux["vna_other"]] = (aux.name, verneed.name)
        elif isinstance(section, GNUVerDefSection):
            for verdef, auxiliaries in section.iter_versions():
                names = [aux.name for aux in auxiliaries]
                # The BASE entry names the file itself, not a version symbols carry.
                if names and not verdef["vd_flags"] & 0x1:
                    defined[verdef["vd_ndx"]] = names[0]
    return needed, defined


def read_shared_object(path: Path, *, with_symbols: bool = True) -> SharedObject:
    """Read one shared object's dynamic section and dynamic symbols.

    ``with_symbols=False`` reads the dynamic section only (what the loader follows:
    SONAME, DT_NEEDED, RPATH, RUNPATH) and leaves imports and exports empty: reading the
    symbols of a CUDA torch's libraries with pyelftools takes tens of seconds, and the
    load order needs none of them."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as handle:
            return _read(path, ELFFile(handle), with_symbols=with_symbols)
    except (ELFError, OSError) as error:
        raise ElfReadError(
            f"cannot read {path} as an ELF shared library: {error}",
            fix="pass the torch_xla _XLAC extension and torch's lib/ directory of one "
            "Linux installation (or the wheels they come from)",
        ) from None


def _read(path: Path, elf: ELFFile, *, with_symbols: bool) -> SharedObject:
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.sections import SymbolTableSection

    soname: str | None = None
    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            for tag in section.iter_tags():
                if tag.entry.d_tag == "DT_NEEDED":
                    needed.append(tag.needed)  # type: ignore[attr-defined]
                elif tag.entry.d_tag == "DT_RPATH":
                    rpath += [p for p in tag.rpath.split(":") if p]  # type: ignore[attr-defined]
                elif tag.entry.d_tag == "DT_RUNPATH":
                    runpath += [p for p in tag.runpath.split(":") if p]  # type: ignore[attr-defined]
                elif tag.entry.d_tag == "DT_SONAME":
                    soname = tag.soname  # type: ignore[attr-defined]
    if not with_symbols:
        return SharedObject(path, soname, tuple(needed), (), (), tuple(rpath), tuple(runpath))
    dynsym = elf.get_section_by_name(".dynsym")
    if not isinstance(dynsym, SymbolTableSection):
        raise ElfReadError(
            f"{path} has no dynamic symbol table: it is not a shared library",
            fix="pass a shared library (.so) from a Linux wheel or installation",
        )
    required, defined = _version_tables(elf)
    imports: list[Import] = []
    exports: list[Export] = []
    for name, binding, visibility, undefined, index in _dynamic_symbols(elf, dynsym):
        if not name:
            continue
        if undefined:
            version, version_file = required.get(index & ~_VERSYM_HIDDEN, (None, None))
            imports.append(Import(name, binding == "STB_WEAK", version, version_file))
        elif binding in EXPORTING_BINDINGS:
            exports.append(
                Export(
                    name,
                    binding,
                    visibility,
                    defined.get(index & ~_VERSYM_HIDDEN),
                    bool(index & _VERSYM_HIDDEN),
                )
            )
    return SharedObject(
        path, soname, tuple(needed), tuple(imports), tuple(exports), tuple(rpath), tuple(runpath)
    )


#: (name, binding, visibility, undefined, version index) of one ``.dynsym`` entry.
RawSymbol = tuple[str, str, str, bool, int]
_BINDINGS = {0: "STB_LOCAL", 1: "STB_GLOBAL", 2: "STB_WEAK", 10: "STB_LOOS"}
_VISIBILITIES = ("STV_DEFAULT", "STV_INTERNAL", "STV_HIDDEN", "STV_PROTECTED")
#: Elf64_Sym: st_name (u32), st_info (u8), st_other (u8), st_shndx (u16), value, size.
_ELF64_SYM = struct.Struct("<IBBHQQ")


def _dynamic_symbols(elf: ELFFile, dynsym: SymbolTableSection) -> Iterator[RawSymbol]:
    """Every ``.dynsym`` entry with its ``.gnu.version`` index (1 without versions).

    An x86_64 object (ELF64, little-endian) is unpacked with :mod:`struct` straight from
    the section's bytes: pyelftools builds a container per symbol, which took 40 s for
    torch_xla 2.7.0's ``_XLAC`` (about a million symbols) where unpacking takes one. Any
    other class or byte order goes through pyelftools, value for value the same."""
    from elftools.elf.gnuversions import GNUVerSymSection

    versym = elf.get_section_by_name(".gnu.version")
    fast = (
        elf.elfclass == 64
        and elf.little_endian
        and sys.byteorder == "little"  # array("H") reads .gnu.version natively
        and dynsym["sh_entsize"] == _ELF64_SYM.size
    )
    if not fast:
        yield from _symbols_through_pyelftools(dynsym, versym)
        return
    count = dynsym.data_size // _ELF64_SYM.size
    indices = (
        array("H", versym.data()[: 2 * count])
        if isinstance(versym, GNUVerSymSection)
        else array("H", [1]) * count
    )
    strings = elf.get_section(dynsym["sh_link"]).data()
    for number, (name_at, info, other, shndx, _value, _size) in enumerate(
        _ELF64_SYM.iter_unpack(dynsym.data()[: count * _ELF64_SYM.size])
    ):
        end = strings.find(b"\0", name_at)
        name = strings[name_at:end].decode("utf-8", errors="replace")
        index = indices[number]
        if index >= _VER_NDX_LORESERVE:  # reserved indices: pyelftools reads them as global
            index = 1
        binding = _BINDINGS.get(info >> 4, f"STB_{info >> 4}")
        yield name, binding, _VISIBILITIES[other & 3], shndx == 0, index


def _symbols_through_pyelftools(dynsym: SymbolTableSection, versym: object) -> Iterator[RawSymbol]:
    from elftools.elf.gnuversions import GNUVerSymSection

    indices: list[int] | None = None
    if isinstance(versym, GNUVerSymSection):
        # pyelftools names the two special indices; the loader sees numbers.
        indices = [
            _SPECIAL_INDEX.get(n, 1) if isinstance(n, str) else int(n)
            for n in (entry["ndx"] for entry in versym.iter_symbols())
        ]
    for number, symbol in enumerate(dynsym.iter_symbols()):
        info = symbol["st_info"]
        yield (
            symbol.name,
            info["bind"],
            symbol["st_other"]["visibility"],
            symbol["st_shndx"] == "SHN_UNDEF",
            indices[number] if indices is not None else 1,
        )
