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
import zipfile
from pathlib import Path

from xla_host import runner, waitlock

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


# The pip ``venv`` would install (ensurepip's bundled wheel), the venv's site-packages and
# its bytecode tag. Debian's ensurepip keeps its wheels elsewhere (python3-pip-whl).
_BUNDLED_PIP = (
    "import ensurepip, json, pathlib, sys, sysconfig\n"
    "found = sorted((pathlib.Path(ensurepip.__file__).parent / '_bundled').glob('pip-*.whl'))\n"
    "print(json.dumps([str(found[-1]) if found else '', sysconfig.get_paths()['purelib'],\n"
    "                  sys.implementation.cache_tag]))"
)
#: The file that puts the bundled pip on a venv's path.
BUNDLED_PIP_PTH = "xla-wheels-bundled-pip.pth"
#: Where, under a pip cache directory (the builder mounts the machine's), ensurepip's pip
#: is unpacked and compiled once per machine for every clean environment that runs it.
BUNDLED_PIP_DIR = "xla-wheels-bundled-pip"


def pip_from_bundle(venv: Path, unpacked_in: Path) -> str:
    """Make ``python -m pip`` work in ``venv`` (made ``--without-pip``) without installing
    pip into it: a ``.pth`` file puts ensurepip's bundled wheel, the very pip ``venv``
    installs, on the venv's path, unpacked and compiled once per machine under
    ``unpacked_in`` (run from the zip, pip compiled itself again at every start: 1 s).
    Installing it with ensurepip took 3 s of CPU at every ship check, most of a small
    build's collect stage. Without a bundled wheel, ensurepip installs pip as ``venv``
    would. Returns what was done, for the log."""
    python = venv / "bin" / "python"
    found = runner.run([str(python), "-I", "-c", _BUNDLED_PIP], echo="none", timeout=120)
    wheel, site_packages, cache_tag = json.loads(found.stdout)
    if not wheel:
        ensurepip = [str(python), "-I", "-m", "ensurepip", "--default-pip"]
        runner.run(ensurepip, echo="none", timeout=600)
        return f"pip installed into {venv} by ensurepip"

    def unpack(directory: Path) -> dict[str, object]:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(directory)
        compile_all = [str(python), "-I", "-m", "compileall", "-q", str(directory)]
        runner.run(compile_all, echo="none", timeout=600)
        return {"wheel": wheel}

    unpacked = waitlock.make_once(
        unpacked_in / f"{Path(wheel).stem}-{cache_tag}", unpack, marker=".unpacked",
        doing=f"unpacking {Path(wheel).name}",
    )  # fmt: skip
    (Path(site_packages) / BUNDLED_PIP_PTH).write_text(f"{unpacked}\n", encoding="utf-8")
    return f"pip on {venv}'s path from {Path(wheel).name}, unpacked in {unpacked}"
