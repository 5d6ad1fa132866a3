"""``abi-check``: does torch_xla's ``_XLAC`` find every symbol it needs in the paired torch?

Exit 0: nothing missing. Exit 1: symbols (or libraries) missing, each named. Exit 2: the
pair cannot be read (the error names the input and the fix).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from xla_host.errors import PipelineError
from xla_wheels.abi import pairs
from xla_wheels.bundle import load_bundle
from xla_wheels.cli.arguments import add_bundle_arguments
from xla_wheels.cli.settings import pipeline_options
from xla_wheels.options import machine_cache
from xla_wheels.settings_rows import add_settings


def resolve(args: argparse.Namespace, work: Path) -> pairs.PairFiles:
    """The pair the arguments name; wheels are extracted into ``work``."""
    sources = {
        "python": args.python,
        "wheels": args.torch_wheel or args.torch_xla_wheel,
        "bundle": args.bundle,
        "files": args.extension or args.torch_lib_dir,
        "stock": args.stock,
    }
    given = [source for source, value in sources.items() if value]
    if len(given) != 1:
        raise pairs.AbiInputError(
            "give exactly one pair (--python, --torch-wheel with --torch-xla-wheel, --bundle, "
            "--extension with --torch-lib-dir, or --stock); got " + (", ".join(given) or "none"),
            fix="make abi-check PYTHON=<env python> | TORCH_WHEEL=<torch.whl> "
            "TORCH_XLA_WHEEL=<xla.whl> | BUNDLE=<name> | STOCK=2.8.0:2.9.0",
        )
    source = given[0]
    if source == "python":
        return pairs.from_python(args.python)
    if source == "wheels":
        if not (args.torch_wheel and args.torch_xla_wheel):
            raise pairs.AbiInputError(
                "two wheels make a pair: both --torch-wheel and --torch-xla-wheel are needed",
                fix="make abi-check TORCH_WHEEL=<torch .whl> TORCH_XLA_WHEEL=<torch_xla .whl>",
            )
        return pairs.from_wheels(args.torch_wheel, args.torch_xla_wheel, work)
    if source == "bundle":
        return _from_bundle(args, work)
    if source == "files":
        return _from_files(args.extension, args.torch_lib_dir)
    return _from_stock(args.stock)


def _from_bundle(args: argparse.Namespace, work: Path) -> pairs.PairFiles:
    # Imported here: the publish stage's lock reader is only needed for this source.
    from xla_wheels.layout import BundleLayout
    from xla_wheels.publish.wheels import locked_wheels
    from xla_wheels.wheels_lock import read_lock

    options = pipeline_options(args, os.environ)
    bundle = load_bundle(options.root, args.bundle)
    directory = BundleLayout.of(options, bundle.name).dist
    try:
        wheels = locked_wheels(read_lock(options.lock_path), bundle.name, directory)
    except PipelineError as error:
        raise pairs.AbiInputError(error.message, fix=error.fix) from None
    torch, torch_xla = pairs.pick_pair([w.path for w in wheels], f"dist/{bundle.name}")
    return pairs.from_wheels(torch, torch_xla, work)


def _from_files(extension: Path | None, lib_dir: Path | None) -> pairs.PairFiles:
    if extension is None or lib_dir is None or not extension.is_file() or not lib_dir.is_dir():
        raise pairs.AbiInputError(
            f"--extension must be an _XLAC .so file and --torch-lib-dir torch's lib/ "
            f"directory (got {extension} and {lib_dir})",
            fix="make abi-check XLAC=<site-packages>/_XLAC.<abi>.so "
            "TORCH_LIB_DIR=<site-packages>/torch/lib",
        )
    return pairs.PairFiles(extension, lib_dir, f"torch libraries in {lib_dir}", extension.name)


def _from_stock(spec: str) -> pairs.PairFiles:
    from xla_wheels.abi.stock import stock_pair

    torch, sep, torch_xla = spec.partition(":")
    if not sep or not torch or not torch_xla:
        raise pairs.AbiInputError(
            f"--stock {spec!r} is not TORCH:TORCH_XLA",
            fix="make abi-check STOCK=2.8.0:2.9.0 (stock torch 2.8.0 with torch_xla 2.9.0)",
        )
    return stock_pair(torch, torch_xla, root=machine_cache(os.environ))


def cmd_abi_check(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="xla-wheels-abi-") as work:
        result = pairs.check_pair(resolve(args, Path(work)))
    print(pairs.render(result))
    pairs.ensure_compatible(result)
    return 0


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Define subcommand ``name``'s (``abi-check``) arguments on ``parser`` and its handler."""
    if name != "abi-check":
        raise ValueError(f"{name} is not a subcommand of {__name__}")
    add_bundle_arguments(parser, writes_bundle=False)  # a temporary directory only
    add_settings(
        parser, name, "--python", "--torch-wheel", "--torch-xla-wheel", "--extension",
        "--torch-lib-dir", "--stock",
    )  # fmt: skip
    parser.set_defaults(handler=cmd_abi_check)
