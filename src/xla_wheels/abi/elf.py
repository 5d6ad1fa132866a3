"""The ELF reader: what a shared object needs, imports and exports (pyelftools).

Only the dynamic symbol table (``.dynsym``) matters to the dynamic linker, so only it is
read. Symbol versions come from ``.gnu.version`` (one index per symbol),
``.gnu.version_r`` (the versions this object requires, each naming the library file that
must define it) and ``.gnu.version_d`` (the versions this object defines). A reference
``name@V`` that requires version ``V`` of ``libc.so.6`` is bound to that file; an
unversioned reference may be satisfied by any loaded object.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection, GNUVerSymSection
from elftools.elf.sections import SymbolTableSection

from xla_host.errors import ExitCode, PipelineError

#: Bindings under which a defined symbol is visible to other objects (GNU_UNIQUE is
#: reported by pyelftools as ``STB_LOOS``, the value it shares with STB_GNU_UNIQUE).
EXPORTING_BINDINGS = frozenset({"STB_GLOBAL", "STB_WEAK", "STB_LOOS", "STB_GNU_UNIQUE"})
#: ``.gnu.version`` index 0 is "local", 1 is "global, unversioned"; bit 15 marks a hidden
#: (non-default, ``name@V`` rather than ``name@@V``) definition.
_VERSYM_HIDDEN = 0x8000
_SPECIAL_INDEX = {"VER_NDX_LOCAL": 0, "VER_NDX_GLOBAL": 1}


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


def read_shared_object(path: Path) -> SharedObject:
    """Read one shared object's dynamic section and dynamic symbols."""
    try:
        with open(path, "rb") as handle:
            return _read(path, ELFFile(handle))
    except (ELFError, OSError) as error:
        raise ElfReadError(
            f"cannot read {path} as an ELF shared library: {error}",
            fix="pass the torch_xla _XLAC extension and torch's lib/ directory of one "
            "Linux installation (or the wheels they come from)",
        ) from None


def _read(path: Path, elf: ELFFile) -> SharedObject:
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
    dynsym = elf.get_section_by_name(".dynsym")
    if not isinstance(dynsym, SymbolTableSection):
        raise ElfReadError(
            f"{path} has no dynamic symbol table: it is not a shared library",
            fix="pass a shared library (.so) from a Linux wheel or installation",
        )
    versym = elf.get_section_by_name(".gnu.version")
    indices: list[int] | None = None
    if isinstance(versym, GNUVerSymSection):
        # pyelftools names the two special indices; the loader sees numbers.
        indices = [
            _SPECIAL_INDEX.get(n, 1) if isinstance(n, str) else int(n)
            for n in (entry["ndx"] for entry in versym.iter_symbols())
        ]
    required, defined = _version_tables(elf)
    imports: list[Import] = []
    exports: list[Export] = []
    for number, symbol in enumerate(dynsym.iter_symbols()):
        name = symbol.name
        if not name:
            continue
        info = symbol["st_info"]
        index = indices[number] if indices is not None else 1
        if symbol["st_shndx"] == "SHN_UNDEF":
            version, version_file = required.get(index & ~_VERSYM_HIDDEN, (None, None))
            imports.append(Import(name, info["bind"] == "STB_WEAK", version, version_file))
        elif info["bind"] in EXPORTING_BINDINGS:
            exports.append(
                Export(
                    name,
                    info["bind"],
                    symbol["st_other"]["visibility"],
                    defined.get(index & ~_VERSYM_HIDDEN),
                    bool(index & _VERSYM_HIDDEN),
                )
            )
    return SharedObject(
        path, soname, tuple(needed), tuple(imports), tuple(exports), tuple(rpath), tuple(runpath)
    )
