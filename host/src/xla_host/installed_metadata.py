"""What an interpreter has installed, read from its distribution metadata: the one probe.

``doctor`` and ``verify-install`` (versions, where torch_xla sits), the gate's receipt
(versions, the RECORD file lists to compare with the locked wheels) and the ABI check
(where ``libc10.so`` and ``_XLAC*.so`` are) all ask the interpreter under test through this
script. It reads ``importlib.metadata`` only and never imports torch or torch_xla, so a
torch_xla that fails to import still shows its version and files, and it reports the
torch modules a site hook imported at start-up. Standard library only (the gate's
receipt step runs without the pipeline's dependencies).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from xla_host import runner
from xla_host.errors import ExitCode, PipelineError

# Runs in the interpreter under test: metadata only, nothing of torch is imported
# (importlib.util.find_spec finds a top-level package without executing it).
_SCRIPT = r"""
import importlib.metadata as md, importlib.util, json, sys
names, listed = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {"python": sys.executable, "version": "%d.%d" % sys.version_info[:2], "dists": {},
       "imported": sorted(m for m in sys.modules if m.startswith("torch"))}
for name in names:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    entry = out["dists"][name] = {"version": dist.version, "site": str(dist.locate_file("")),
                                  "files": [], "package_dir": None}
    if name in listed:
        entry["files"] = [str(f) for f in (dist.files or [])]
        spec = importlib.util.find_spec(name) if name.isidentifier() else None
        if spec and spec.submodule_search_locations:
            entry["package_dir"] = str(list(spec.submodule_search_locations)[0])
print(json.dumps(out))
"""


class ProbeFailed(PipelineError):
    """The interpreter could not be run or could not read its metadata."""


class NoInterpreter(ProbeFailed):
    """The interpreter named is no program this host can run (absent, not executable, a
    directory): the command line is wrong (exit 2), not the environment."""

    exit_code = ExitCode.BAD_INPUT


@dataclass(frozen=True)
class InstalledDistribution:
    version: str
    site: str
    """The directory the distribution's files are relative to (site-packages)."""
    files: tuple[str, ...]
    """Its RECORD (paths relative to ``site``); only for the names asked ``with_files``."""
    package_dir: str | None
    """Where the import system finds the top-level package of that name (``with_files``)."""


@dataclass(frozen=True)
class Installed:
    python: str
    version: str
    """``major.minor`` of the interpreter."""
    dists: Mapping[str, InstalledDistribution]
    """By the name as asked; a name not installed is absent."""
    imported: tuple[str, ...]
    """torch modules already imported at start-up (a site hook importing torch)."""

    def version_of(self, name: str) -> str | None:
        dist = self.dists.get(name)
        return None if dist is None else dist.version


def read_installed(
    python: str,
    names: Sequence[str],
    *,
    with_files: Sequence[str] = (),
    isolated: bool = False,
    timeout: float = 120,
) -> Installed:
    """Run the probe in ``python``; ``isolated`` adds ``-I`` (no PYTHON* variables, no user
    site), for checks that judge the environment rather than the host's shell."""
    argv = [python, *(["-I"] if isolated else []), "-c", _SCRIPT]
    argv += [json.dumps(list(dict.fromkeys([*names, *with_files]))), json.dumps(list(with_files))]
    try:
        result = runner.run(argv, echo="none", timeout=timeout)
    except runner.StepTimedOut as error:
        raise ProbeFailed(f"cannot run the interpreter {python}: {error.message}") from None
    except (FileNotFoundError, PermissionError, NotADirectoryError) as error:
        raise NoInterpreter(f"cannot run the interpreter {python}: {error}") from None
    except OSError as error:
        raise ProbeFailed(f"cannot run the interpreter {python}: {error}") from None
    except runner.CommandFailed as failed:  # a ProbeFailed: its callers report it their way
        raise ProbeFailed(
            f"{python} could not read its installed packages: "
            f"{failed.result.stderr.strip()[-400:]}"
        ) from None
    data = json.loads(result.stdout)
    dists = {
        name: InstalledDistribution(
            entry["version"], entry["site"], tuple(entry["files"]), entry["package_dir"]
        )
        for name, entry in data["dists"].items()
    }
    return Installed(data["python"], data["version"], dists, tuple(data["imported"]))
