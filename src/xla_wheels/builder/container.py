"""The engine layer: docker, podman, buildah or the host behind one context manager.

Modelled on cibuildwheel's ``oci_container.py``: ``with engine:`` starts one container
from the builder image, ``engine.call(argv)`` runs a command in it,
leaving the block removes it. Every directory the build touches is mounted at its own
absolute path, so paths in specs, logs and ``.git`` files mean the same inside and out.

- docker / podman: ``run --detach ... sleep infinity`` once, then ``exec`` per command.
- buildah: ``buildah from`` once, then ``buildah run --isolation chroot -v ...`` per
  command (mounts are given per run). This is what works without a daemon and without
  ``podman run`` (which fails on hosts that forbid setrlimit, as on our CI machines).
- host (BUILD_MODE=host): the same calls as plain subprocesses.

User: a non-root caller's uid:gid runs the build (files it writes stay the caller's);
the image's default USER is the unprivileged ``builder``. Only a root caller gets root in
the container, and that is logged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from xla_host import log, runner
from xla_host.errors import PipelineError


class EngineError(PipelineError):
    """The container engine failed to start, run or remove the builder container."""


@dataclass(frozen=True)
class Mount:
    path: Path
    read_only: bool = False


class Engine(contextlib.AbstractContextManager["Engine"]):
    """How to start, call and stop; itself the host (BUILD_MODE=host): plain subprocesses,
    nothing to start or stop. The engines' subclasses fill the argv builders."""

    def __init__(
        self, name: str, image: str, mounts: Sequence[Mount], env: Mapping[str, str]
    ) -> None:
        self.name = name
        self.image = image
        self.mounts = list(mounts)
        self.env = dict(env)
        self.container = f"xla-wheels-{uuid.uuid4().hex[:12]}"

    # -- argv composition (also used by the DRY_RUN plan) --------------------------------
    def start_argv(self) -> list[str] | None:
        return None

    def call_argv(self, argv: Sequence[str]) -> list[str]:
        return list(argv)

    def stop_argv(self) -> list[str] | None:
        return None

    def run_options(self, volume: str) -> list[str]:
        """The container's user, its mounts (each after ``volume``) and its environment."""
        uid, gid = os.getuid(), os.getgid()
        options = ["--user", f"{uid}:{gid}"] if uid != 0 else []
        for mount in self.mounts:
            options += [volume, f"{mount.path}:{mount.path}" + (":ro" if mount.read_only else "")]
        for key, value in sorted(self.env.items()):
            options += ["--env", f"{key}={value}"]
        return options

    # -- running ---------------------------------------------------------------------------
    def __enter__(self) -> Engine:
        argv = self.start_argv()
        if argv:
            if os.getuid() == 0:
                log.warning(
                    "running as root: the container runs as root too (a normal user's "
                    "`make wheels` runs the build as that user's uid)"
                )
            runner.run(
                argv,
                fix="check `make builder-image ENGINE=...` built the image, and that "
                f"`{self.name} info` works",
            )
        return self

    def __exit__(self, *_: object) -> None:  # removes the container however the block ended
        if argv := self.stop_argv():
            runner.run(argv, check=False)  # the block's own error, if any, is the one told

    def call(self, argv: Sequence[str]) -> int:
        # The engine's child environment inherits ours (PATH, proxies, DOCKER_HOST).
        env = self.env if self.name == "host" else None
        # Its own process group: a recipe's tools (setup.py, compilers, Bazel) end with it
        # when the run is interrupted, whoever was sent the signal (runner.run).
        return runner.run(
            self.call_argv(argv), env=env, output="inherit", own_group=True, check=False
        ).returncode


class DockerEngine(Engine):
    """docker and podman share the command line we use."""

    def start_argv(self) -> list[str]:
        options = self.run_options("--volume")
        run = [self.name, "run", "--detach", "--rm", "--name", self.container, "--init"]
        return [*run, *options, self.image, "sleep", "infinity"]

    def call_argv(self, argv: Sequence[str]) -> list[str]:
        return [self.name, "exec", self.container, *argv]

    def stop_argv(self) -> list[str]:
        return [self.name, "rm", "--force", self.container]


class BuildahEngine(Engine):
    def start_argv(self) -> list[str]:
        return ["buildah", "from", "--pull-never", "--name", self.container, self.image]

    def call_argv(self, argv: Sequence[str]) -> list[str]:
        options = self.run_options("-v")
        return ["buildah", "run", "--isolation", "chroot", *options, self.container, "--", *argv]

    def stop_argv(self) -> list[str]:
        return ["buildah", "rm", self.container]


def make_engine(
    mode: str, engine: str, image: str, mounts: Sequence[Mount], env: Mapping[str, str]
) -> Engine:
    name = "host" if mode == "host" else engine
    kind = {"host": Engine, "buildah": BuildahEngine}.get(name, DockerEngine)
    return kind(name, image, mounts, env)


def probe_engine(engine: str, timeout: float = 10.0) -> str | None:
    """None when the engine can run containers here; else what is wrong (one line)."""
    if shutil.which(engine) is None:
        return f"{engine} is not installed"
    probe = {
        "docker": ["docker", "info", "--format", "{{.ServerVersion}}"],
        "podman": ["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"],
        "buildah": ["buildah", "info"],
    }[engine]
    try:
        process = runner.run(probe, echo="none", timeout=timeout, check=False)
    except runner.StepTimedOut:
        return f"`{' '.join(probe)}` did not answer within {timeout:.0f}s (daemon hung?)"
    if process.returncode != 0:
        detail = (process.stderr.strip() or process.stdout.strip()).splitlines()
        return f"`{' '.join(probe)}` failed: {detail[-1] if detail else 'no output'}"
    return None


def image_present(engine: str, image: str, timeout: float = 10.0) -> bool:
    argv = {
        "docker": ["docker", "image", "inspect", image],
        "podman": ["podman", "image", "exists", image],
        "buildah": ["buildah", "inspect", "--type", "image", image],
    }[engine]
    try:
        process = runner.run(argv, echo="none", timeout=timeout, check=False)
    except runner.StepTimedOut:
        return False
    return process.returncode == 0


def build_image_argv(
    engine: str,
    image: str,
    root: Path,
    target: str = "builder",
    build_args: tuple[str, ...] = (),
) -> list[str]:
    """The command that builds the builder image from the top-level Dockerfile.

    podman and buildah default to the OCI image format, which has no SHELL instruction:
    the Dockerfile's `SHELL ["/bin/bash", "-o", "pipefail", "-c"]` would be dropped and its
    RUN steps would run under /bin/sh without pipefail. `--format docker` keeps it.
    https://github.com/containers/podman/issues/8477
    """
    # The Dockerfile's ARGs (BASE_IMAGE, LLVM_APT_BASE, BAZELISK_BASE_URL, ...) point the
    # build at mirrors; docs/building.md "Builder image behind a mirror".
    extra = [item for arg in build_args for item in ("--build-arg", arg)]
    if engine == "docker":
        return ["docker", "build", *extra, "--target", target, "--tag", image, str(root)]
    tool = (
        ["podman", "build", "--isolation=chroot"]
        if engine == "podman"
        else ["buildah", "bud", "--isolation", "chroot"]
    )
    return [*tool, "--format", "docker", *extra, "--target", target, "--tag", image, str(root)]
