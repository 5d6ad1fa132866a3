"""``make host-wheel``: the host package's wheel, built reproducibly from a commit's ``host/``,
with a version that follows the package's content.

The version is ``0.1.<n>+g<tree>``: ``n`` the number of commits that changed ``host/`` up
to the commit (it grows with every change, so pip's newest is the last one), ``tree`` the
first 12 hex digits of git's hash of that ``host/`` tree (the content itself: two
branches with as many changes never share a name). A changed host package therefore gets
a new file name, and publishes into a lane that holds the previous one without a hand
bump; the same ``host/`` always builds the same name and bytes (``SOURCE_DATE_EPOCH`` is
the time of the last commit that changed ``host/``, setuptools is pinned in
``host/pyproject.toml``), so publishing it again is skipped, never refused. The lane's
requirements file and the bundle document's lane pin the wheel by hash.

``host/VERSION`` holds a working tree's version (``0.1.0.dev0``, for ``pip install -e``);
the build writes the commit's into its own copy. A shallow clone counts only the commits
it has: build from a full clone (CI: ``fetch-depth: 0``).

The wheel goes into ``dist/host/``; a host wheel of another version that was there is
moved to ``dist/host/older/`` (nothing is deleted), so ``dist/host/`` holds the one wheel
``make publish`` puts into the lane.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from xla_host import filemode, log
from xla_host.edge import exit_code_of
from xla_host.errors import PipelineError
from xla_host.filemode import file_sha256
from xla_wheels.gitutil import git, git_out

HOST_DIR = "host"
BASE_VERSION = "0.1"
WHEEL_DIR = Path("dist") / "host"
OLDER_DIRNAME = "older"
BUILD_TIMEOUT_S = 600.0
"""pip builds the wheel in an isolated environment (setuptools from the index or cache)."""


class HostWheelError(PipelineError):
    """The host wheel could not be built (pip failed) or is not reproducible: exit 1."""


def host_version(repo: Path, rev: str = "HEAD") -> str:
    """The host package's version at ``rev`` (module doc)."""
    count = git_out(["rev-list", "--count", rev, "--", HOST_DIR], cwd=repo)
    tree = git_out(["rev-parse", f"{rev}:{HOST_DIR}"], cwd=repo)
    return f"{BASE_VERSION}.{count}+g{tree[:12]}"


def _source_date_epoch(repo: Path, rev: str) -> str:
    return git_out(["log", "-1", "--format=%ct", rev, "--", HOST_DIR], cwd=repo)


def _export(repo: Path, rev: str, into: Path) -> Path:
    """``host/`` as committed at ``rev``, into ``into`` (what the wheel is built from:
    never the working tree's uncommitted files)."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, HOST_DIR],
        cwd=repo, capture_output=True, check=True, timeout=BUILD_TIMEOUT_S,
    )  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into / HOST_DIR


def build(repo: Path, *, rev: str = "HEAD", python: str = sys.executable) -> Path:
    """Build the host wheel of ``rev`` into ``<repo>/dist/host/`` (module doc); its path."""
    git(["rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=repo)  # a clear error first
    version = host_version(repo, rev)
    dest = repo / WHEEL_DIR
    with tempfile.TemporaryDirectory(prefix="xla-wheels-host-wheel-") as tmp:
        source = _export(repo, rev, Path(tmp) / "src")
        (source / "VERSION").write_text(f"{version}\n")
        out = Path(tmp) / "wheel"
        env = {**os.environ, "SOURCE_DATE_EPOCH": _source_date_epoch(repo, rev)}
        built = subprocess.run(
            [python, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
             "--no-deps", "--wheel-dir", str(out), str(source)],
            env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
        )  # fmt: skip
        if built.returncode != 0:
            raise HostWheelError(
                f"pip could not build the host wheel of {rev}: {built.stderr.strip()[-2000:]}",
                fix="pip must reach setuptools (pinned in host/pyproject.toml) on its index "
                "or in its cache: check PIP_INDEX_URL / the network, then run it again",
            )
        (wheel,) = out.glob("xla_wheels_host-*.whl")
        return _keep(wheel, dest)


def _keep(wheel: Path, dest: Path) -> Path:
    """``wheel`` into ``dest``; any other host wheel there moves to ``dest/older/``."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / wheel.name
    if target.exists() and file_sha256(target) != file_sha256(wheel):
        raise HostWheelError(
            f"{target} exists with other bytes than this build of the same commit: the "
            "build is not reproducible here (another setuptools or Python?)",
            fix=f"move {target} aside and compare the two wheels (diffoscope); a lane that "
            "holds the old one refuses the new one under the same name",
        )
    for other in sorted(dest.glob("xla_wheels_host-*.whl")):
        if other.name != wheel.name:
            (dest / OLDER_DIRNAME).mkdir(exist_ok=True)
            other.replace(dest / OLDER_DIRNAME / other.name)
            log.info(f"host-wheel: {other.name} moved to {dest / OLDER_DIRNAME}/")
    filemode.copy_by_rename(wheel, target)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m xla_wheels.release.host_wheel",
        description="Build the host package's wheel of a commit into dist/host/.",
    )
    parser.add_argument("--rev", default="HEAD", help="the commit to build (default HEAD)")
    args = parser.parse_args(argv)

    def run() -> int:
        wheel = build(Path.cwd(), rev=args.rev)
        log.result(f"{wheel.relative_to(Path.cwd())}  sha256:{file_sha256(wheel)}")
        return 0

    return exit_code_of(run)


if __name__ == "__main__":
    sys.exit(main())
