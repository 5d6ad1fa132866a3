"""Cached Python environments with stock torch + torch_xla from PyPI, one per machine.

The gate needs environments it can judge without anything built by this project: stock
torch_xla 2.9.0 shows the persistent-cache defect, stock 2.7.0 (from before the OpenXLA
API change) is the working control. Building one takes minutes and about 7 GB (torch's
default Linux wheel pulls the nvidia packages; ``--no-deps`` torch does not import), so
each is built once per machine under ``<cache>/envs/``, where ``<cache>`` is the
per-machine cache the CLI derives with ``options.machine_cache`` (the same as the
pipeline's: ``$XLA_WHEELS_CACHE``, else ``$XDG_CACHE_HOME/xla-wheels``, else
``~/.cache/xla-wheels``) and passes in as ``root``.

Creation is atomic and safe under concurrency: a per-environment ``fcntl`` lock serialises
builders, the venv is built in a temporary sibling directory and renamed into place only
after it imported torch_xla, and the final directory is trusted only if it carries the
marker file written last. A half-built environment is therefore never reused.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from xla_host import filemode, log, runner
from xla_host.gate.errors import GateEnvironmentError
from xla_host.waitlock import make_once
from xla_wheels import venv_check

MARKER = "xla-wheels-env.json"
#: How long one pip install may take before we call the registry unreachable.
INSTALL_TIMEOUT_S = 1800.0
#: Extra ``python -m venv`` options (tests that never run pip pass ``--without-pip``).
VENV_OPTIONS: tuple[str, ...] = ()


@dataclass(frozen=True)
class StockEnvSpec:
    """Exact pins of one stock environment (torch_xla pins the exact torch version)."""

    torch: str
    torch_xla: str

    def requirements(self) -> list[str]:
        return [f"torch=={self.torch}", f"torch_xla=={self.torch_xla}"]


STOCK_SPECS: dict[str, StockEnvSpec] = {
    "2.9.0": StockEnvSpec(torch="2.9.0", torch_xla="2.9.0"),
    "2.7.0": StockEnvSpec(torch="2.7.0", torch_xla="2.7.0"),
}
#: What ``make gate`` judges when no PYTHON is given: the newest stock release, whose
#: persistent cache is broken, so a newcomer sees the defect in one command.
DEFAULT_STOCK = "2.9.0"


def env_name(spec: StockEnvSpec, python_tag: str) -> str:
    machine = f"{sys.platform}-{platform.machine()}"
    return f"stock-torch{spec.torch}-xla{spec.torch_xla}-{python_tag}-{machine}"


def _read_marker(env_dir: Path) -> dict[str, object] | None:
    try:
        data = json.loads(filemode.read_shared(env_dir / MARKER, what="environment marker"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def env_python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


def _run_logged(argv: list[str], log_file: Path, *, env: dict[str, str] | None = None) -> None:
    def failed(result: subprocess.CompletedProcess[str]) -> GateEnvironmentError:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-15:])
        return GateEnvironmentError(
            f"command failed (exit {result.returncode}): {log.format_command(argv)}\n{tail}",
            fix="check the package registry and disk space, then run again",
        )

    with open(log_file, "a") as out:
        try:
            runner.run(argv, env=env, output=out, timeout=INSTALL_TIMEOUT_S, error=failed)
        except runner.StepTimedOut as error:
            # The gate cannot judge without its environment: its exit 2, not a step's.
            raise GateEnvironmentError(
                error.message, fix="check that the package registry is reachable"
            ) from None


def check_wheels_exist(spec: StockEnvSpec, py_version: str, pip_python: str) -> None:
    """Fail early, with the reason, if PyPI has no torch_xla wheel for this Python."""
    with tempfile.TemporaryDirectory(prefix="xla-wheels-probe-") as target:
        argv = [
            pip_python, "-m", "pip", "install", "--dry-run", "--no-deps", "--quiet",
            "--only-binary=:all:", "--python-version", py_version, "--target", target,
            f"torch_xla=={spec.torch_xla}",
        ]  # fmt: skip
        try:
            result = runner.run(argv, echo="none", timeout=300, check=False)
        except (OSError, runner.StepTimedOut) as error:
            raise GateEnvironmentError(
                f"could not ask the package index for torch_xla {spec.torch_xla}: {error}",
                fix="check that PyPI is reachable",
            ) from error
    if result.returncode != 0:
        if "No matching distribution" in result.stderr:
            raise GateEnvironmentError(
                f"PyPI has no torch_xla {spec.torch_xla} wheel for Python {py_version}",
                fix="run the pipeline with a Python that torch_xla ships wheels for "
                "(3.10-3.12 for 2.7.0; 3.10-3.13 for 2.9.0)",
            )
        raise GateEnvironmentError(
            f"probing PyPI for torch_xla {spec.torch_xla} failed: {result.stderr.strip()[-500:]}",
            fix="check that PyPI is reachable",
        )


def ensure_stock_env(version: str, *, root: Path) -> Path:
    """The python of the cached stock environment, building it first if needed.

    Its venv is made by this interpreter, so it has this interpreter's Python version.
    """
    try:
        spec = STOCK_SPECS[version]
    except KeyError:
        raise GateEnvironmentError(
            f"no stock environment is defined for torch_xla {version}",
            fix=f"use one of: {', '.join(sorted(STOCK_SPECS))}",
        ) from None
    py_version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    name = env_name(spec, "cp" + py_version.replace(".", ""))

    def build(tmp: Path) -> dict[str, object]:
        with log.section(f"create stock environment {name} (once per machine, ~7 GB)"):
            check_wheels_exist(spec, py_version, sys.executable)
            build_log = tmp / "build.log"
            _run_logged([sys.executable, "-m", "venv", *VENV_OPTIONS, str(tmp)], build_log)
            python = str(env_python(tmp))
            if (problem := venv_check.outside_venv(Path(python), tmp)) is not None:
                raise GateEnvironmentError(problem, fix=venv_check.fix_for(tmp))
            _install(python, spec, build_log)
            _verify(python, build_log)
        return {"spec": asdict(spec), "python": py_version, "created": time.time()}

    final = make_once(
        root / "envs" / name,
        build,
        marker=MARKER,
        doing=f"building {name}",
        usable=lambda env_dir: _read_marker(env_dir) is not None and env_python(env_dir).exists(),
    )
    return env_python(final)


def _install(python: str, spec: StockEnvSpec, build_log: Path) -> None:
    log.info(f"installing {' '.join(spec.requirements())} (log: {build_log})")
    _run_logged(
        [python, "-m", "pip", "install", "--disable-pip-version-check", *spec.requirements()],
        build_log,
        env=dict(venv_check.PIP_REQUIRE_VIRTUALENV),  # never into the base interpreter
    )


def _verify(python: str, build_log: Path) -> None:
    """Prove the environment imports torch_xla before anyone may use it."""
    _run_logged(
        [python, "-c", "import torch, torch_xla; print(torch.__version__, torch_xla.__version__)"],
        build_log,
        # A child process: it inherits this environment (proxies, TMPDIR) on purpose.
        env={"PJRT_DEVICE": "CPU"},
    )


def resolve_python(python: Path | None, stock_root: Path) -> Path:
    """``python``, else the cached stock torch_xla environment's (built on first use)."""
    if python is not None:
        return python
    log.info(f"no --python given: judging stock torch_xla {DEFAULT_STOCK} from PyPI")
    return ensure_stock_env(DEFAULT_STOCK, root=stock_root)
