"""The ABI check of a torch / torch_xla pair (``make abi-check``).

Real ELF files throughout: a tiny pair compiled here with g++ (tests/abi_support.py) for
the linker's rules, and the shared libraries of stock PyPI wheels (cached per machine)
for the real controls: torch_xla 2.9.0 fits torch 2.9.0 and misses exactly five c10
symbols in torch 2.8.0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.abi_support import (
    EXTENSION_NAME,
    MISSING,
    TinyPair,
    _compile,
    build_tiny_pair,
    torch_wheel,
    torch_xla_wheel,
)
from tests.conftest import CliResult
from xla_wheels.abi import pairs, ship
from xla_wheels.abi.compare import compare, mangled_scope, scope_of
from xla_wheels.abi.elf import Export, Import, SharedObject
from xla_wheels.abi.stock import StockWheel, ensure_stock_libraries, stock_pair
from xla_wheels.builder import build_and_collect, collect
from xla_wheels.options import machine_cache

FIVE = {
    "c10::SymInt::operator_imul_slow_path(c10::SymInt const&)",
    "c10::SymInt::sym_eq_slow_path(c10::SymInt const&) const",
    "c10::SymInt::sym_ne_slow_path(c10::SymInt const&) const",
    "c10::SymInt::maybe_as_int_slow_path() const",
    "c10::TensorImpl::sym_is_non_overlapping_and_dense_custom() const",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyPair:
    return build_tiny_pair(tmp_path_factory.mktemp("tiny-abi"))


def _check(extension: Path, lib_dir: Path) -> pairs.AbiResult:
    return pairs.check_pair(pairs.PairFiles(extension, lib_dir, "torch", "torch_xla"))


def _missing_names(result: pairs.AbiResult) -> set[str]:
    return {symbol.name for symbol in result.comparison.missing}


# --- the linker's rules, on real ELF files --------------------------------------------


def test_the_libraries_it_was_linked_against_miss_nothing(tiny: TinyPair) -> None:
    result = _check(tiny.extension, tiny.build_lib)
    assert result.ok
    assert result.comparison.torch_libraries == ("libc10.so", "libtorch.so")
    assert result.comparison.checked == 6


def test_another_torch_misses_the_dropped_and_the_reversioned_symbols(tiny: TinyPair) -> None:
    result = _check(tiny.extension, tiny.other_lib)
    # new_fn is still exported, but as new_fn@@C10_1: the reference needs new_fn@C10_2.
    # maybe_fn is a weak reference nothing defines (bound to 0, not an import error);
    # PyLong_FromLong is the interpreter's, printf/putchar glibc's.
    assert _missing_names(result) == MISSING
    versions = {s.name: s.version for s in result.comparison.missing}
    assert versions["new_fn"] == "C10_2"
    assert result.comparison.weak_ignored >= 1
    assert dict(result.comparison.elsewhere)["the Python interpreter"] == 1
    groups = {(g.library, g.scope): g.symbols for g in result.groups}
    assert groups[("libtorch.so", "c10::SymInt")] == (
        ("c10::SymInt::gone_method() const", "_ZNK3c106SymInt11gone_methodEv"),
    )
    text = pairs.render(result)
    assert "new_fn@C10_2" in text and "MISSING 3 symbol(s)" in text


def test_a_missing_torch_library_is_named(tiny: TinyPair, tmp_path: Path) -> None:
    only_c10 = tmp_path / "lib"
    only_c10.mkdir()
    (only_c10 / "libc10.so").write_bytes((tiny.build_lib / "libc10.so").read_bytes())
    result = _check(tiny.extension, only_c10)
    assert result.missing_libraries == ("libtorch.so",)
    assert not result.ok


# --- the pure comparison, on data ------------------------------------------------------


def _library(*exports: Export, name: str = "libc10.so") -> SharedObject:
    return SharedObject(Path(name), name, (), (), exports)


def _extension(*imports: Import) -> SharedObject:
    return SharedObject(Path("_XLAC.so"), "_XLAC.so", ("libc10.so",), imports, ())


def nested_site(work: Path, runpath: str) -> Path:
    """A site-packages as a CUDA torch lays it out: ``_XLAC`` needs only ``libtorch.so``;
    ``libtorch.so`` needs ``libdeep.so`` in ``nvidia/deep/lib``, found through its RUNPATH;
    ``_XLAC`` calls ``deep_fn``, which only ``libdeep.so`` defines."""
    site = work / "site-packages"
    for directory in ("torch/lib", "nvidia/deep/lib"):
        (site / directory).mkdir(parents=True)
    _compile(site / "nvidia/deep/lib/libdeep.so", 'extern "C" void deep_fn(void) {}\n',
             "-Wl,-soname,libdeep.so", cwd=work)  # fmt: skip
    _compile(site / "torch/lib/libtorch.so", 'extern "C" void torch_fn(void) {}\n',
             f"-L{site / 'nvidia/deep/lib'}", "-Wl,--no-as-needed", "-ldeep",
             f"-Wl,--enable-new-dtags,-rpath,{runpath}", "-Wl,-soname,libtorch.so",
             cwd=work)  # fmt: skip
    _compile(site / EXTENSION_NAME,
             'extern "C" void deep_fn(void);\nextern "C" void torch_fn(void);\n'
             'extern "C" void entry(void) { torch_fn(); deep_fn(); }\n',
             f"-L{site / 'torch/lib'}", "-ltorch", "-Wl,-soname,_XLAC.so", cwd=work)  # fmt: skip
    return site


def test_symbols_resolve_through_the_libraries_torchs_libraries_need(tmp_path: Path) -> None:
    site = nested_site(tmp_path, "$ORIGIN/../../nvidia/deep/lib")
    result = _check(site / EXTENSION_NAME, site / "torch/lib")
    assert result.ok, pairs.render(result)
    assert result.comparison.torch_libraries == ("libtorch.so", "libdeep.so")


def test_a_library_the_loader_would_not_find_resolves_nothing(tmp_path: Path) -> None:
    # The RUNPATH points where libdeep.so is not: ld.so would not load it, nor bind deep_fn.
    site = nested_site(tmp_path, "$ORIGIN/../../nvidia/elsewhere/lib")
    result = _check(site / EXTENSION_NAME, site / "torch/lib")
    assert _missing_names(result) == {"deep_fn"}


def test_hidden_visibility_and_hidden_versions_do_not_export() -> None:
    library = _library(
        Export("hidden_vis", "STB_GLOBAL", "STV_HIDDEN"),
        Export("protected", "STB_GLOBAL", "STV_PROTECTED"),
        Export("old_only", "STB_GLOBAL", "STV_DEFAULT", "V1", hidden_version=True),
    )
    extension = _extension(
        Import("hidden_vis", weak=False),
        Import("protected", weak=False),
        Import("old_only", weak=False),  # unversioned: a hidden name@V1 does not bind
        Import("old_only", weak=False, version="V1", version_file="libc10.so"),
    )
    result = compare(extension, [library])
    assert [(m.name, m.version) for m in result.missing] == [
        ("hidden_vis", None),
        ("old_only", None),
    ]


def test_references_versioned_against_other_libraries_are_theirs() -> None:
    extension = _extension(
        Import("memcpy", weak=False, version="GLIBC_2.14", version_file="libc.so.6"),
        Import("_Py_Dealloc", weak=False),
        Import("__gmon_start__", weak=True),
    )
    result = compare(extension, [_library()])
    assert result.ok and result.checked == 0 and result.weak_ignored == 1
    assert dict(result.elsewhere) == {"libc.so.6": 1, "the Python interpreter": 1}


def test_a_reference_versioned_against_a_library_not_yet_read_is_still_torchs() -> None:
    # check_pair reads symbols library by library and stops once everything binds: a
    # reference versioned against a mapped library it has not read yet must count as
    # missing so far, never as another library's business (which would stop it early).
    extension = _extension(
        Import("cuda_fn", weak=False, version="CUDA_1", version_file="libc10_cuda.so")
    )
    so_far = compare(extension, [_library()], ["libc10.so", "libc10_cuda.so"])
    assert not so_far.ok and so_far.checked == 1 and so_far.elsewhere == ()
    assert so_far.torch_libraries == ("libc10.so", "libc10_cuda.so")
    defined = Export("cuda_fn", "STB_GLOBAL", "STV_DEFAULT", "CUDA_1")
    read = [_library(), _library(defined, name="libc10_cuda.so")]
    assert compare(extension, read, ["libc10.so", "libc10_cuda.so"]).ok


def test_fast_symbol_reading_gives_what_pyelftools_gives(tiny: TinyPair) -> None:
    from elftools.elf.elffile import ELFFile

    from xla_wheels.abi import elf as elf_reader

    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    objects = [tiny.extension, *sorted(tiny.build_lib.glob("*.so")), libc]
    for path in objects:
        if not path.exists():
            continue
        with path.open("rb") as handle:
            elf = ELFFile(handle)
            dynsym = elf.get_section_by_name(".dynsym")
            fast = list(elf_reader._dynamic_symbols(elf, dynsym))
            versym = elf.get_section_by_name(".gnu.version")
            assert fast == list(elf_reader._symbols_through_pyelftools(dynsym, versym)), path
            assert fast, path


@pytest.mark.parametrize(
    ("demangled", "scope"),
    [
        ("c10::SymInt::operator_imul_slow_path(c10::SymInt const&)", "c10::SymInt"),
        ("c10::TensorImpl::sym_is_non_overlapping_and_dense_custom() const", "c10::TensorImpl"),
        ("at::Tensor at::_ops::add_Tensor::call(at::Tensor const&)", "at::_ops::add_Tensor"),
        ("c10::ArrayRef<long>::vec() const", "c10::ArrayRef<long>"),
        ("vtable for c10::TensorImpl", "c10::TensorImpl"),
        ("gone_fn", "(global)"),
    ],
)
def test_scope_of_a_demangled_name(demangled: str, scope: str) -> None:
    assert scope_of(demangled) == scope


def test_mangled_scope() -> None:
    assert mangled_scope("_ZNK3c106SymInt16sym_eq_slow_pathERKS0_") == "3c106SymInt"
    assert mangled_scope("_ZN3c106SymInt23operator_imul_slow_pathERKS0_") == "3c106SymInt"
    assert mangled_scope("gone_fn") is None


# --- the command line -------------------------------------------------------------------


def test_cli_exit_codes_on_files(tiny: TinyPair, run_cli) -> None:
    ok = run_cli("abi-check", "--extension", str(tiny.extension),
                 "--torch-lib-dir", str(tiny.build_lib))  # fmt: skip
    assert ok.exit_code == 0, ok.stderr
    assert "ok: every symbol" in ok.stdout
    bad = run_cli("abi-check", "--extension", str(tiny.extension),
                  "--torch-lib-dir", str(tiny.other_lib))  # fmt: skip
    assert bad.exit_code == 1, bad.stderr
    assert "c10::SymInt::gone_method() const" in bad.stdout
    assert "error:" in bad.stderr and "gone_fn" in bad.stderr and "new_fn@C10_2" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_cli_reads_two_wheels_extracting_only_what_it_needs(
    tiny: TinyPair, tmp_path: Path, run_cli
) -> None:
    torch = torch_wheel(tiny.other_lib, tmp_path / "wheels")
    xla = torch_xla_wheel(tiny.extension, tmp_path / "wheels")
    result = run_cli("abi-check", "--torch-wheel", str(torch), "--torch-xla-wheel", str(xla))
    assert result.exit_code == 1, result.stderr
    assert "torch_xla 2.9.0 (torch_xla-2.9.0-cp311-cp311-linux_x86_64.whl)" in result.stdout
    assert "MISSING 3 symbol(s)" in result.stdout


def _bad_inputs(tiny: TinyPair, tmp: Path) -> list[tuple[list[str], str]]:
    not_zip = tmp / "torch-2.9.0-py3-none-any.whl"
    not_zip.write_text("not a zip")
    not_elf = tmp / EXTENSION_NAME
    not_elf.write_text("not an ELF file")
    no_xlac = torch_xla_wheel(None, tmp / "no-xlac")
    torch = torch_wheel(tiny.build_lib, tmp / "wheels")
    return [
        ([], "give exactly one pair"),
        (["--python", sys.executable, "--torch-wheel", str(torch)], "got python, wheels"),
        (["--torch-wheel", str(torch)], "both --torch-wheel and --torch-xla-wheel"),
        (["--torch-wheel", str(tmp / "nope.whl"), "--torch-xla-wheel", str(no_xlac)],
         "does not exist"),
        (["--torch-wheel", str(not_zip), "--torch-xla-wheel", str(no_xlac)], "not a wheel"),
        (["--torch-wheel", str(torch), "--torch-xla-wheel", str(no_xlac)],
         f"not applicable: no _XLAC extension in {no_xlac.name}"),
        (["--extension", str(not_elf), "--torch-lib-dir", str(tiny.build_lib)],
         "cannot read"),
        (["--extension", str(tiny.extension)], "--torch-lib-dir"),
        (["--stock", "2.8.0"], "is not TORCH:TORCH_XLA"),
        (["--python", str(tmp / "no-python")], "cannot run the interpreter"),
        (["--python", sys.executable], "not applicable: torch_xla is not installed"),
        (["--bundle", "no-such-bundle"], "no-such-bundle"),
    ]  # fmt: skip


@pytest.mark.slow
def test_bad_inputs_exit_2_with_an_error_and_a_fix(tiny: TinyPair, tmp_path: Path, run_cli) -> None:
    for args, expected in _bad_inputs(tiny, tmp_path):
        result: CliResult = run_cli("abi-check", *args)
        assert result.exit_code == 2, (args, result.stdout, result.stderr)
        assert expected in result.stderr, (args, result.stderr)
        assert "fix:" in result.stderr and "Traceback" not in result.stderr, args


# --- the build's ship check ---------------------------------------------------------------


def test_ship_check_stops_a_mismatched_pair_before_dist(tiny: TinyPair, tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    torch_wheel(tiny.other_lib, staging)
    torch_xla_wheel(tiny.extension, staging)
    with pytest.raises(collect.ShipCheckFailed) as raised:
        build_and_collect._abi_check(staging, "syn")
    assert "kept out of dist/syn" in raised.value.message
    assert "c10::SymInt::gone_method() const" in raised.value.message


def test_ship_check_passes_the_pair_it_was_built_with(tiny: TinyPair, tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    wheels = [torch_wheel(tiny.build_lib, staging), torch_xla_wheel(tiny.extension, staging)]
    outcome = ship.check_staged(wheels, "staging")
    assert outcome.result is not None and outcome.result.ok


def test_ship_check_without_xlac_says_not_applicable(tmp_path: Path, tiny: TinyPair) -> None:
    staging = tmp_path / "staging"
    wheels = [torch_wheel(tiny.build_lib, staging), torch_xla_wheel(None, staging)]
    outcome = ship.check_staged(wheels, "staging")
    assert outcome.result is None
    assert outcome.note.startswith("not applicable: no _XLAC extension in torch_xla-")


# --- real controls: stock PyPI wheels' libraries (cached per machine) --------------------


@pytest.fixture(scope="session")
def stock_abi_libraries() -> Path:
    """torch_xla 2.9.0, torch 2.9.0 and torch 2.8.0 libraries, extracted once per machine.

    First run on a machine: three ``pip download``s (~1.9 GB, about a minute) of which
    ~1.2 GB of shared libraries are kept under ``<cache>/abi-libs``.
    """
    root = machine_cache(os.environ)
    for project, version in (("torch_xla", "2.9.0"), ("torch", "2.9.0"), ("torch", "2.8.0")):
        ensure_stock_libraries(StockWheel(project, version), root=root)
    return root


@pytest.mark.slow
def test_stock_torch_xla_2_9_fits_stock_torch_2_9(stock_abi_libraries: Path, run_cli) -> None:
    result = run_cli("abi-check", "--stock", "2.9.0:2.9.0",
                     env={"XLA_WHEELS_CACHE": str(stock_abi_libraries)})  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "libc10.so, libtorch.so, libtorch_cpu.so, libtorch_python.so" in result.stdout
    assert "ok: every symbol and library _XLAC needs from torch is there" in result.stdout


@pytest.mark.slow
def test_stock_torch_xla_2_9_misses_five_c10_symbols_in_torch_2_8(
    stock_abi_libraries: Path, run_cli
) -> None:
    result = pairs.check_pair(stock_pair("2.8.0", "2.9.0", root=stock_abi_libraries))
    readable = {name for group in result.groups for name, _ in group.symbols}
    assert readable == FIVE
    assert {g.scope for g in result.groups} == {"c10::SymInt", "c10::TensorImpl"}
    assert {g.library for g in result.groups} == {"libc10.so"}
    assert not result.missing_libraries

    cli = run_cli("abi-check", "--stock", "2.8.0:2.9.0",
                  env={"XLA_WHEELS_CACHE": str(stock_abi_libraries)})  # fmt: skip
    assert cli.exit_code == 1, cli.stderr
    assert "MISSING 5 symbol(s)" in cli.stdout
    for name in FIVE:
        assert name in cli.stderr  # the error line names each one


@pytest.mark.slow
def test_installed_stock_environment_is_checked_without_importing(
    stock_xla_python_29: Path, run_cli
) -> None:
    result = run_cli("abi-check", "--python", str(stock_xla_python_29))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "torch_xla 2.9.0 against torch 2.9.0" in result.stdout


@pytest.mark.slow
def test_stock_2_7_pair_fits_through_libtorch_cuda(stock_xla_python_27: Path, run_cli) -> None:
    # The 4 c10::cuda symbols _XLAC imports are libc10_cuda.so's, which _XLAC does not
    # name: libtorch.so needs libtorch_cuda.so, which needs libc10_cuda.so (ld.so's order).
    result = run_cli("abi-check", "--python", str(stock_xla_python_27))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "torch_xla 2.7.0 against torch 2.7.0" in result.stdout
    assert "libc10_cuda.so" in result.stdout


@pytest.mark.slow
def test_cli_reads_a_bundles_locked_wheels(tiny: TinyPair, tmp_path: Path) -> None:
    from tests.clirunner import run_cli
    from tests.publish_support import BUNDLE, make_publish_project

    wheels = [
        torch_wheel(tiny.other_lib, tmp_path / "wheels"),
        torch_xla_wheel(tiny.extension, tmp_path / "wheels"),
    ]
    project = make_publish_project(tmp_path, wheels)
    result = run_cli("abi-check", "--bundle", BUNDLE, root=project, inherit_env=True)
    assert result.exit_code == 1, result.output
    assert "MISSING 3 symbol(s)" in result.stdout
    # A wheel changed after locking is refused, as bad input.
    (project / "dist" / BUNDLE / wheels[0].name).write_bytes(b"changed")
    changed = run_cli("abi-check", "--bundle", BUNDLE, root=project, inherit_env=True)
    assert changed.exit_code == 2, changed.output
    assert "do not match wheels.lock" in changed.stderr
