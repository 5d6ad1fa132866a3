"""Shared fixtures. Stage-specific fixtures live next to their tests or below."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import clirunner, gcs_support, missing_tools, real_source
from tests.clirunner import CliResult
from tests.gate_helpers import GateRun, run_gate_cli
from tests.gcs_support import GcsEmulator
from tests.gitrepos import Upstream, make_upstreams
from tests.once_per_run import once_per_run
from tests.synthetic_upstream import (
    Synthetic,
    copy_synthetic,
    load_synthetic,
    make_synthetic,
    save_synthetic,
)
from xla_host.net import NetworkPolicy
from xla_wheels.options import machine_cache
from xla_wheels.series_checks.toolchain import Toolchain, ensure_toolchain

#: Fixtures for every module (fake wheels and a pypiserver to publish them to, a real
#: tmpfs): named once here, not imported into each module that asks for one.
pytest_plugins = ("tests.publish_support", "tests.disk_support", "tests.cpu_cost")


@pytest.fixture
def upstreams(tmp_path: Path) -> dict[str, Upstream]:
    """Throwaway upstream git repositories for torch, torch_xla and openxla."""
    return make_upstreams(tmp_path)


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., CliResult]:
    """:func:`tests.clirunner.run_cli` with a minimal environment and its own cache and home."""

    def run(*args: str, env: dict[str, str] | None = None, **kwargs: Any) -> CliResult:
        isolated = {
            "XLA_WHEELS_CACHE": str(tmp_path / "machine-cache"),
            "HOME": str(tmp_path / "home"),
        }
        return clirunner.run_cli(*args, env={**isolated, **(env or {})}, timeout=300, **kwargs)

    return run


# --- The synthetic upstream (tests/synthetic_upstream.py) ------------------------------


@pytest.fixture(scope="session")
def synthetic_template(tmp_path_factory: pytest.TempPathFactory) -> Synthetic:
    """The synthetic project, made once per pytest run. Never change it: take ``syn``."""

    def make(directory: Path) -> None:
        save_synthetic(make_synthetic(directory), directory / "commits.json")

    def load(directory: Path) -> Synthetic:
        return load_synthetic(directory, directory / "commits.json")

    return once_per_run(tmp_path_factory, "synthetic", make, load)


@pytest.fixture
def syn(synthetic_template: Synthetic, tmp_path: Path) -> Synthetic:
    """This test's own copy of the synthetic project (upstream repositories, project root)."""
    return copy_synthetic(synthetic_template, tmp_path)


# --- Stock torch_xla environments (the gate's real evidence) --------------------------
# Built once per machine from PyPI by the project's own code (xla_wheels.stock_envs) and
# cached under <the per-machine cache>/envs/ (options.machine_cache); the first session pays
# about 1.5 minutes and 7 GB each, later sessions reuse them.


@pytest.fixture(scope="session")
def stock_xla_python_29() -> Path:
    """Python of a venv with stock torch 2.9.0 + torch_xla 2.9.0 (persistent cache broken)."""
    from xla_wheels import stock_envs as envs

    return envs.ensure_stock_env("2.9.0", root=machine_cache(os.environ))


@pytest.fixture(scope="session")
def stock_xla_python_27() -> Path:
    """Python of a venv with stock torch 2.7.0 + torch_xla 2.7.0 (persistent cache works)."""
    from xla_wheels import stock_envs as envs

    return envs.ensure_stock_env("2.7.0", root=machine_cache(os.environ))


def _gate_once_per_run(
    tmp_path_factory: pytest.TempPathFactory,
    key: str,
    *args: str,
    own_tmpdir: bool = False,
    own_baselines: bool = True,
    pack: bool = False,
) -> GateRun:
    """``gate ARGS`` once per pytest run, shared by the workers: its report in
    ``<dir>/report``; ``own_baselines``: its baselines in ``<dir>/baselines``;
    ``own_tmpdir``: TMPDIR is ``<dir>/tmp``, so a test can see the gate left nothing
    behind in it."""

    def make(directory: Path) -> None:
        env = None
        if own_tmpdir:
            (directory / "tmp").mkdir()
            env = {"TMPDIR": str(directory / "tmp")}
        baselines = ["--baselines-dir", str(directory / "baselines")] if own_baselines else []
        if pack:
            # A cache pack of the restart check's cold run (tests/test_cache_pack.py), signed
            # with a key of its own: <dir>/packs/, <dir>/pack-key.pem and its .pub.pem.
            sign_key = directory / "pack-key.pem"
            subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(sign_key)],
                           check=True, capture_output=True)  # fmt: skip
            subprocess.run(["openssl", "pkey", "-in", str(sign_key), "-pubout", "-out",
                            str(directory / "pack-key.pub.pem")], check=True)  # fmt: skip
            baselines += ["--pack", str(directory / "packs"), "--pack-key", str(sign_key)]
        run = run_gate_cli("gate", *args, *baselines, out_dir=directory / "report", env=env)
        run.save(directory / "run.json")

    return once_per_run(tmp_path_factory, key, make, lambda d: GateRun.load(d / "run.json"))


@pytest.fixture(scope="session")
def gate_27(stock_xla_python_27: Path, tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    """One run of every gate check on stock 2.7.0 per pytest run, for the tests that only
    read its report or receipt (test_gate_stock.py, test_gate_cache_checks.py,
    test_gate_canary.py, test_gate_recalibration.py, test_gate_key_probe.py: the key
    probe's fast subset). Three warm runs: on
    the SPMD variant, 8 steps and three loaders make a miss of 2.7.0's hang unlikely. No
    baseline (an empty baselines directory), so its checks run side by side as a user's
    gate on CPU does."""
    return _gate_once_per_run(
        tmp_path_factory, "gate-stock-2.7.0", "--python", str(stock_xla_python_27),
        "--warm-runs", "3", "--key-probes", "fast", own_tmpdir=True, pack=True,
    )  # fmt: skip


@pytest.fixture(scope="session")
def gate_29(stock_xla_python_29: Path, tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    """``make gate`` with no arguments, once per pytest run: it judges the cached stock
    2.9.0 environment with every check and the shipped baselines (test_gate_stock.py,
    test_gate_canary.py)."""
    return _gate_once_per_run(
        tmp_path_factory, "gate-default", own_tmpdir=True, own_baselines=False
    )


# --- A Cloud Storage server on loopback (tests/gcs_support.py) --------------------------


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    """fake-gcs-server on 127.0.0.1, one per pytest worker (the tests that use it share an
    xdist group, conftest's ``_worker_groups``, so most runs start one; a second starts
    where a test reads a gate run too and goes to the gate's worker: test_cache_pack's
    warm start); each test makes its own bucket (``GcsEmulator.make_bucket``)."""
    with gcs_support.gcs_emulator(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture(scope="session")
def gcs_host_python(tmp_path_factory: pytest.TempPathFactory, host_wheel: Path) -> Path:
    """A fresh host that reads buckets: a venv with the host wheel and google-cloud-storage,
    no checkout (tests/gcs_support.py ``host_with_library``); made once per worker."""
    return gcs_support.host_with_library(tmp_path_factory.mktemp("gcs-host"), host_wheel)


# --- The real pytorch/xla source (tests/real_source.py) -------------------------------


#: Fixtures that need a stock torch_xla environment (the compiled checks' toolchain takes
#: torch's headers and libraries from the stock 2.9.0 one).
STOCK_XLA_FIXTURES = frozenset(
    {
        "stock_xla_python_27",
        "stock_xla_python_29",
        "gate_27",
        "gate_29",
        "series_toolchain",
    }
)


#: Gate runs made once per pytest run (tests/once_per_run.py): the tests that read one
#: share a worker, which makes it. Spread over two workers, the second one blocked on the
#: run's lock for as long as the first took to make it (67 s measured for gate_27).
ONCE_PER_RUN_GATES = frozenset({"gate_27", "gate_29"})

#: Servers made once per pytest worker (session fixtures): the tests that use one share
#: an xdist group, so a run starts it once, not once per worker.
ONCE_PER_RUN_SERVERS = frozenset({"gcs_emulator"})


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tiers from what a test uses, so they are per test and cannot be forgotten: the real
    source (the pytorch_xla_repo fixture, directly or through base_tree/patched_tree) makes
    a ``real_source`` test; a stock torch_xla environment (STOCK_XLA_FIXTURES, directly or
    through another fixture) a ``stock_xla`` one.

    Under xdist (``--dist loadgroup``) the tests that share a module-scoped fixture (a
    gate run, a release story) run on one worker, so it is made once per pytest run, not
    once per worker, and so do the tests that read one of the gate runs made once per
    pytest run (ONCE_PER_RUN_GATES). Every other test goes wherever a worker is free: the
    gate's verdicts hold beside a busy process (gate/README.md). tryfirst: xdist's own
    hook reads the ``xdist_group`` marks, and a mark added after it is ignored (it was,
    until this ran first: one module's gate run was made twice, once on each worker).
    """
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "pytorch_xla_repo" in fixtures:
            item.add_marker(pytest.mark.real_source)
        if fixtures & STOCK_XLA_FIXTURES:
            item.add_marker(pytest.mark.stock_xla)
    for item, group in _worker_groups(items).items():
        item.add_marker(pytest.mark.xdist_group(group))
    # The long tests first (stable, the same order on every worker): workers hand out
    # tests in this order, and a gate run started last would run alone at the end.
    items.sort(key=lambda item: 0 if item.get_closest_marker("stock_xla") else 1)


def _worker_groups(items: list[pytest.Item]) -> dict[pytest.Item, str]:
    """The xdist group of each test that shares something made once: a gate run made once
    per pytest run (its name), else its module's fixtures (the module's path). A module
    whose tests read a gate run and share a module fixture joins that gate's group whole:
    split between the gate's worker and their module's group, the module fixture was made
    twice, once on each worker (a whole gate run, 37 CPU-seconds, in test_gate_cache_checks)."""
    gate_of_module: dict[str, str] = {}
    module_of: dict[pytest.Item, str] = {}
    groups: dict[pytest.Item, str] = {}
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        fixtures = set(getattr(item, "fixturenames", ()))
        gates = sorted(fixtures & ONCE_PER_RUN_GATES) or sorted(fixtures & ONCE_PER_RUN_SERVERS)
        if _shares_a_module_fixture(item):
            module = module_of[item] = item.nodeid.split("::")[0]
            if gates:
                gate_of_module.setdefault(module, gates[0])
        elif gates:
            groups[item] = gates[0]
    groups.update({item: gate_of_module.get(m, m) for item, m in module_of.items()})
    return groups


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definitions[-1].scope in ("module", "class", "package")
        for definitions in info.name2fixturedefs.values()
        if definitions
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """In CI, a skip that would leave part of the suite unrun fails instead: a
    ``real_source`` test (when the shared snapshot is present) and a test whose tool is
    missing (:mod:`tests.missing_tools`; a tool that cannot exist here still skips)."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    if item.get_closest_marker("real_source") is not None and real_source.required_in_ci(
        os.environ
    ):
        report.outcome = "failed"
        report.longrepr = (
            "a real_source test skipped in CI (CI is set and "
            f"{real_source.SHARED_SNAPSHOT.name} exists beside the project), which CI must "
            f"not allow: {reason}"
        )
    elif missing_tools.is_missing_tool(reason) and real_source.is_ci(os.environ):
        report.outcome = "failed"
        report.longrepr = (
            f"a test skipped in CI for a missing tool, which CI must install: {reason}"
        )


@pytest.fixture(scope="session")
def pytorch_xla_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bare repository holding the real pytorch/xla history at c04e61c (and v2.9.0 when
    the source has it): TORCH_XLA_SRC or the shared snapshot, through alternates."""
    choice = real_source.choose_source(os.environ)
    if choice.path is None:
        pytest.skip(choice.why_none)
    dest = tmp_path_factory.mktemp("pytorch-xla-source") / "pytorch-xla.git"
    try:
        return real_source.alternates_repository(choice.path, dest)
    except real_source.SourceUnusable as error:
        pytest.fail(f"{real_source.SOURCE_VARIABLE} or the shared snapshot is unusable: {error}")


@pytest.fixture(scope="session")
def base_tree(pytorch_xla_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work tree of pytorch/xla at the series' base, c04e61c. Read it, never change it."""
    dest = tmp_path_factory.mktemp("pytorch-xla-base") / "xla"
    return real_source.worktree(pytorch_xla_repo, dest, real_source.BASE)


@pytest.fixture(scope="session")
def patched_tree(pytorch_xla_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """c04e61c with the series applied, one commit per patch (its header the message).
    Read it, never change it."""
    dest = tmp_path_factory.mktemp("pytorch-xla-patched") / "xla"
    tree = real_source.worktree(pytorch_xla_repo, dest, real_source.BASE)
    real_source.apply_series(tree, real_source.series_patches())
    return tree


@pytest.fixture(scope="session")
def series_toolchain() -> Toolchain:
    """g++, torch 2.9.0, absl and googletest for the series' compiled checks, set up in
    the per-machine cache on first use (xla_wheels.series_checks.toolchain)."""
    return ensure_toolchain(machine_cache(os.environ), NetworkPolicy())
