"""Real shared libraries for the ABI check's tests, compiled with the system's g++.

A pair in miniature of what happens between torch releases: ``_XLAC`` is linked against
"build" torch libraries; the "other" torch libraries drop a function and a C++ method and
move ``new_fn`` from version ``C10_2`` back to ``C10_1``. The extension also holds the
references the check must not call missing: a weak one nothing defines, a Python C-API
one (the interpreter's), and glibc's versioned ``printf``.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tests.missing_tools import skip_missing

EXTENSION_NAME = "_XLAC.cpython-311-x86_64-linux-gnu.so"

C10 = """
extern "C" void old_fn(void) {}
extern "C" void new_fn(void) {}
"""
C10_BUILD_MAP = "C10_1 { global: old_fn; local: *; };\nC10_2 { global: new_fn; } C10_1;\n"
C10_OTHER_MAP = "C10_1 { global: old_fn; new_fn; local: *; };\n"

TORCH_BUILD = """
namespace c10 { struct SymInt { void kept_method() const; void gone_method() const; }; }
void c10::SymInt::kept_method() const {}
void c10::SymInt::gone_method() const {}
extern "C" void kept_fn(void) {}
extern "C" void gone_fn(void) {}
"""
TORCH_OTHER = """
namespace c10 { struct SymInt { void kept_method() const; }; }
void c10::SymInt::kept_method() const {}
extern "C" void kept_fn(void) {}
"""
EXTENSION = """
#include <cstdio>
namespace c10 { struct SymInt { void kept_method() const; void gone_method() const; }; }
extern "C" void old_fn(void);
extern "C" void new_fn(void);
extern "C" void kept_fn(void);
extern "C" void gone_fn(void);
extern "C" void maybe_fn(void) __attribute__((weak));
extern "C" void *PyLong_FromLong(long);
extern "C" void entry(const c10::SymInt &s) {
  old_fn(); new_fn(); kept_fn(); gone_fn();
  if (maybe_fn) maybe_fn();
  PyLong_FromLong(1);
  std::printf("x");
  s.kept_method(); s.gone_method();
}
"""
#: What "other" lacks, mangled as the dynamic linker reports it.
MISSING = {"gone_fn", "new_fn", "_ZNK3c106SymInt11gone_methodEv"}


@dataclass(frozen=True)
class TinyPair:
    extension: Path
    build_lib: Path
    """torch lib/ the extension was linked against."""
    other_lib: Path
    """torch lib/ of "another release"."""


def _compile(out: Path, source: str, *args: str, cwd: Path) -> None:
    src = cwd / (out.name + ".cpp")
    src.write_text(source)
    subprocess.run(
        ["g++", "-shared", "-fPIC", "-O0", "-o", str(out), str(src), *args],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def build_tiny_pair(work: Path) -> TinyPair:
    if shutil.which("g++") is None:
        skip_missing("g++ is not installed (apt-get install g++): the tiny ELF pair needs it")
    for name in ("build", "other"):
        (work / name).mkdir(parents=True, exist_ok=True)
    for name, c10_map, torch_src in (
        ("build", C10_BUILD_MAP, TORCH_BUILD),
        ("other", C10_OTHER_MAP, TORCH_OTHER),
    ):
        lib = work / name
        (lib / "c10.map").write_text(c10_map)
        _compile(lib / "libc10.so", C10, f"-Wl,--version-script={lib / 'c10.map'}",
                 "-Wl,-soname,libc10.so", cwd=lib)  # fmt: skip
        _compile(lib / "libtorch.so", torch_src, "-Wl,-soname,libtorch.so", cwd=lib)
    extension = work / EXTENSION_NAME
    _compile(extension, EXTENSION, f"-L{work / 'build'}", "-lc10", "-ltorch",
             "-Wl,-soname,_XLAC.so", cwd=work)  # fmt: skip
    return TinyPair(extension, work / "build", work / "other")


def torch_wheel(lib_dir: Path, out_dir: Path, version: str = "2.9.0") -> Path:
    """A wheel-shaped zip with ``torch/lib/*.so`` (what the check reads of a torch wheel)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"torch-{version}-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for library in sorted(lib_dir.glob("*.so")):
            archive.write(library, f"torch/lib/{library.name}")
        archive.writestr("torch/__init__.py", "")
    return path


def torch_xla_wheel(extension: Path | None, out_dir: Path, version: str = "2.9.0") -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"torch_xla-{version}-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w") as archive:
        if extension is not None:
            archive.write(extension, extension.name)
        archive.writestr("torch_xla/__init__.py", "")
    return path
