"""pip installs only into the venv the run made, never into the interpreter behind it.

A venv's ``bin/python`` is a link to the base interpreter; only ``pyvenv.cfg`` beside it
makes that interpreter the venv. A venv whose ``pyvenv.cfg`` is gone (a concurrent
``venv --clear`` of the same directory, a run killed halfway through making it) still
has a ``bin/python`` that runs, with ``sys.prefix`` the base interpreter's: a ``pip
install`` there writes into the base interpreter's ``site-packages`` (the ship check's
stand-in torch once did). So before pip runs, :func:`outside_venv` asks the interpreter
for its ``sys.prefix`` and refuses unless it is the venv; and pip runs with
:data:`PIP_REQUIRE_VIRTUALENV` set, so that pip itself refuses should the venv break
between the check and the install.

Standard library only (and ``xla_host.runner``): the build recipes use it in the builder
image.
"""

from __future__ import annotations

import json
from pathlib import Path

from xla_host import runner

PIP_REQUIRE_VIRTUALENV = {"PIP_REQUIRE_VIRTUALENV": "1"}
"""pip's own refusal to install outside a venv (``running_under_virtualenv()``)."""

# -I: the caller's PYTHONPATH or PYTHONHOME cannot change what the interpreter reports.
_PREFIXES = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix]))"


def outside_venv(python: Path, venv: Path) -> str | None:
    """Why ``python`` is not the interpreter of ``venv`` (``None``: it is): a pip it runs
    would install somewhere else."""
    result = runner.run([str(python), "-I", "-c", _PREFIXES], echo="none", check=False, timeout=120)
    if result.returncode != 0:
        return f"{python} does not run (exit {result.returncode}): {result.stderr.strip()[-500:]}"
    try:
        prefix, base_prefix = (Path(value) for value in json.loads(result.stdout))
    except (ValueError, TypeError):
        return f"{python} did not report its sys.prefix (it printed {result.stdout[:200]!r})"
    if prefix == base_prefix or prefix.resolve() != venv.resolve():
        missing = "" if (venv / "pyvenv.cfg").is_file() else f" ({venv}/pyvenv.cfg is missing)"
        return (
            f"{python} is not the venv {venv}: its sys.prefix is {prefix}{missing}, so pip "
            "would install outside the environment this run made"
        )
    return None


def fix_for(venv: Path) -> str:
    return (
        f"check that no other run uses {venv} (`ps -ef | grep xla_wheels`), then run the "
        "same command again: it makes the venv afresh"
    )
