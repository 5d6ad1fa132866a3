"""The recipes: the exact commands of the torch and torch_xla builds and of the ship check.

Composed from a :class:`~xla_wheels.builder.spec.BuildSpec` by pure functions, so the
DRY_RUN plan (on the host) and the entry point (``inside``, in the container or on the
host) print and run the same list. Modelled on upstream's own wheel build
(pytorch/xla ``infra/ansible``): torch's ``setup.py bdist_wheel`` with CUDA off, that wheel
installed into the build environment, then torch_xla's ``setup.py bdist_wheel`` from
``pytorch/xla`` inside the PyTorch tree.

Layout, and why a copy: torch_xla's Bazel WORKSPACE loads PyTorch from ``../``
(``bazel/dependencies.bzl``: ``PYTORCH_LOCAL_DIR = "../"``) and its setup.py reads the
torch commit from ``../``. Bazel and Python resolve the working directory physically
(getcwd), so a symlink ``torch/xla -> ../torch_xla`` would make ``../`` the symlink
target's parent, not the torch tree. The recipe therefore copies the patched torch_xla
worktree (tens of MB, no submodules) to ``<torch>/xla`` right before its build, after
the patch stage has checked both trees: the sources and patch stages keep their one
worktree per component, and the build sees upstream's layout.

This module imports only the standard library (it runs inside the builder image).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from xla_wheels import venv_check
from xla_wheels.builder import remote_cache
from xla_wheels.builder.spec import BuildSpec

PATCH_STATE = "openxla_patches.applied.json"

# torch_xla's setup.py (c04e61c, get_git_head_sha) reads the torch revision with
# `git rev-parse HEAD` in ../ only when `os.path.isdir("../.git")`, else it uses ''. It
# writes that revision into torch_xla/csrc/version.cpp as TORCH_GITREV, which
# xla_graph_executor.cpp hashes into every compilation-cache key. Our torch tree is a
# `git worktree`, whose .git is a FILE: without this, TORCH_GITREV would be '' and two
# bundles with the same torch_xla but different torch would share cache keys. So while
# setup.py runs, <torch>/.git is a symlink to the worktree's own git directory (the
# same repository, index and HEAD: the patched commit when torch has a series).
TORCH_GIT_DIR_NOTE = "torch's revision for TORCH_GITREV: setup.py reads ../.git only as a directory"


@dataclass(frozen=True)
class Step:
    """One command (``argv``) or one internal action (``action`` + ``args``)."""

    title: str
    argv: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    path_prepend: tuple[str, ...] = ()
    action: str | None = None
    args: tuple[str, ...] = ()
    only_if_exists: str | None = None
    note: str = ""
    expand: tuple[str, ...] = field(default_factory=tuple)
    """argv entries that are globs, expanded (sorted) when the step runs."""
    secret_env: tuple[tuple[str, str], ...] = ()
    """(NAME, template): ``${key}`` placeholders filled with credentials when the step
    runs (``remote_cache.fill_template``), shown as the redaction marker."""
    git_dir_for: str | None = None
    """A worktree whose ``.git`` file is shown as a directory while the step runs (see
    :data:`TORCH_GIT_DIR_NOTE`); restored afterwards."""

    def render(self) -> str:
        if self.action in ("write-file", "write-private-file"):
            body = " | ".join(remote_cache.redact_template(self.args[1]).splitlines())
            mode = " (mode 0600)" if self.action == "write-private-file" else ""
            text = f"[{self.action}] {self.args[0]}{mode}: {body}"
        elif self.action:
            text = f"[{self.action}] " + " ".join(shlex.quote(a) for a in self.args)
        else:
            parts = []
            if self.cwd:
                parts.append(f"cd {shlex.quote(self.cwd)} &&")
            if self.path_prepend:
                parts.append("PATH=" + ":".join(self.path_prepend) + ":$PATH")
            parts.extend(f"{key}={shlex.quote(value)}" for key, value in self.env)
            parts.extend(
                f"{key}={shlex.quote(remote_cache.redact_template(template))}"
                for key, template in self.secret_env
            )
            parts.extend(shlex.quote(arg) for arg in self.argv)
            text = " ".join(parts)
        if self.only_if_exists:
            text = f"[if {self.only_if_exists} exists] {text}"
        if self.git_dir_for:
            text = f"[with {self.git_dir_for}/.git as a directory] {text}"
        return f"{text}    # {self.note}" if self.note else text


def _common_env(spec: BuildSpec) -> dict[str, str]:
    return {
        "PYTHONPATH": spec.buildenv,
        "PIP_CACHE_DIR": spec.pip_cache_dir,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        # The worktrees' .git files point into the source cache, owned by the caller; git
        # >= 2.35.2 refuses repositories owned by another uid (CVE-2022-24765). The builder
        # only reads HEAD (setup.py's version), so trusting these paths is safe.
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "*",
        **spec.compiler_env,
        **spec.extra_env,
    }


def _sorted_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(env.items()))


def torch_env(spec: BuildSpec) -> dict[str, str]:
    """PyTorch's own build switches for a CPU wheel that torch_xla builds against."""
    return {
        **_common_env(spec),
        "USE_CUDA": "0",
        "USE_CUDNN": "0",
        "USE_NCCL": "0",
        "USE_ROCM": "0",
        "USE_XPU": "0",
        "USE_MPS": "0",
        "BUILD_TEST": "0",
        "PYTORCH_BUILD_VERSION": spec.torch_version,
        # 1 = no ".postN" suffix (PyTorch appends .post<N> for N > 1).
        "PYTORCH_BUILD_NUMBER": "1",
        "MAX_JOBS": str(spec.jobs),
        "CMAKE_C_COMPILER_LAUNCHER": "ccache",
        "CMAKE_CXX_COMPILER_LAUNCHER": "ccache",
        "CCACHE_DIR": spec.ccache_dir,
        "_GLIBCXX_USE_CXX11_ABI": str(spec.knobs["cxx_abi"]),
        **torch_ccache_env(spec)[0],
    }


def torch_ccache_env(spec: BuildSpec) -> tuple[dict[str, str], dict[str, str]]:
    """ccache's base directory and remote storage: (plain, templated with a credential)."""
    settings = remote_cache.RemoteCacheSettings.from_dict(spec.remote_cache)
    # The work tree (out/<bundle>) holds the sources and the build environment: paths
    # under it become relative, the same on every builder.
    return remote_cache.ccache_env(settings, str(Path(spec.torch_src).parent.parent))


def bazel_auth_rc_path(spec: BuildSpec) -> str:
    return f"{spec.private_dir}/bazel-remote-auth.bazelrc"


def torch_xla_env(spec: BuildSpec) -> dict[str, str]:
    """The knobs of torch_xla's setup.py (and build_util.bazel_options_from_env)."""
    knobs = spec.knobs
    # BAZEL_REMOTE_CACHE=1 would select upstream's `--config=remote_cache`, which is
    # Google's own RBE instance; our cache goes into .bazelrc.user instead (see below).
    # SILO_NAME stays unset: build_util.py then adds
    # --remote_default_exec_properties=cache-silo-key=dev, the same on every builder, so
    # their action keys (which include the exec properties) match.
    return {
        **_common_env(spec),
        # We stamp the full version ourselves (commit + patch digest), so setup.py's
        # own "+git<sha7>" suffix is switched off.
        "TORCH_XLA_VERSION": spec.torch_xla_version,
        "GIT_VERSIONED_XLA_BUILD": "0",
        # Series 0003 puts the OpenXLA revision into the cache key; setup.py would
        # otherwise name WORKSPACE's pin, which --override_repository replaces.
        "TORCH_XLA_OPENXLA_REVISION": spec.openxla_revision,
        "BUILD_CPP_TESTS": "1" if knobs["build_cpp_tests"] else "0",
        "BUNDLE_LIBTPU": "1" if knobs["bundle_libtpu"] else "0",
        "TPUVM_MODE": "1" if knobs["tpuvm_mode"] else "0",
        "CXX_ABI": str(knobs["cxx_abi"]),
        "XLA_CUDA": "0",
        "BAZEL_JOBS": str(spec.jobs),
        "BAZEL_DISK_CACHE_PATH": spec.bazel_disk_cache,
    }


def bazelrc_user(spec: BuildSpec) -> str:
    """``.bazelrc.user``, which torch_xla's .bazelrc try-imports last.

    setup.py passes no free-form Bazel flags, so this file is the one place for
    ``--override_repository``. Overriding (rather than rewriting the WORKSPACE pin) keeps
    torch_xla's tree exactly the patched commit, needs no GitHub tarball or sha256, and
    builds the bundle's own patched OpenXLA checkout.
    """
    lines = [
        f"# Written by xla-wheels for bundle {spec.bundle}: OpenXLA is the bundle's pin with",
        "# its patch series and torch_xla's openxla_patches/ applied.",
        # Paths as words of an rc file: a work directory may hold a space or a quote.
        f"build --override_repository=xla={remote_cache.rc_word(spec.openxla_src)}",
        # The output base on a cache volume: a new container re-uses the analysis and
        # external repositories instead of starting from nothing.
        f"startup --output_user_root={remote_cache.rc_word(spec.bazel_output_root)}",
    ]
    settings = remote_cache.RemoteCacheSettings.from_dict(spec.remote_cache)
    lines += remote_cache.bazelrc_lines(settings, bazel_auth_rc_path(spec))
    return "\n".join(lines) + "\n"


def _pip_install_into_buildenv(
    spec: BuildSpec, options: tuple[str, ...], arguments: tuple[str, ...]
) -> tuple[str, ...]:
    """``pip install OPTIONS --target <buildenv> ARGUMENTS`` with the build's Python."""
    return (spec.python, "-m", "pip", "install", *options, "--target", spec.buildenv, *arguments)


def torch_steps(spec: BuildSpec) -> list[Step]:
    tmp = spec.torch_stage + ".tmp"
    env = _sorted_env(torch_env(spec))
    secret_env = _sorted_env(torch_ccache_env(spec)[1])
    return [
        Step("clean staging", ("rm", "-rf", tmp)),
        Step(
            "torch build requirements",
            _pip_install_into_buildenv(
                spec, ("--upgrade",), (*spec.pip_args, "-r", f"{spec.torch_src}/requirements.txt")
            ),
            env=env,
            cwd=spec.torch_src,
            only_if_exists=f"{spec.torch_src}/requirements.txt",
        ),
        Step(
            "torch wheel",
            (spec.python, "setup.py", "bdist_wheel", "--dist-dir", tmp),
            env=env,
            cwd=spec.torch_src,
            path_prepend=(f"{spec.buildenv}/bin",),
            secret_env=secret_env,
        ),
        Step(
            "re-pack the torch wheel reproducibly",
            action="repack-wheel",
            args=(tmp,),
            note="sorted entries, SOURCE_DATE_EPOCH dates, 0644/0755 modes",
        ),
        Step("finish torch stage", action="finish-stage", args=(tmp, spec.torch_stage, "torch")),
    ]


def torch_xla_steps(spec: BuildSpec) -> list[Step]:
    tmp = spec.torch_xla_stage + ".tmp"
    env = _sorted_env(torch_xla_env(spec))
    auth_rc = remote_cache.bazel_auth_rc(
        remote_cache.RemoteCacheSettings.from_dict(spec.remote_cache)
    )
    auth_step = Step(
        "Bazel remote credentials (try-imported by .bazelrc.user)",
        action="write-private-file",
        args=(bazel_auth_rc_path(spec), auth_rc),
    )
    return [
        Step("clean staging", ("rm", "-rf", tmp)),
        Step(
            "install torch into the build environment",
            _pip_install_into_buildenv(
                spec,
                ("--no-deps", "--no-index", "--upgrade"),
                (f"{spec.torch_stage}/torch-*.whl",),
            ),
            env=_sorted_env(_common_env(spec)),
            expand=(f"{spec.torch_stage}/torch-*.whl",),
        ),
        Step(
            "torch_xla build requirements",
            _pip_install_into_buildenv(
                spec, (), (*spec.pip_args, "-r", f"{spec.torch_xla_worktree}/requirements.txt")
            ),
            env=_sorted_env(_common_env(spec)),
            only_if_exists=f"{spec.torch_xla_worktree}/requirements.txt",
        ),
        Step("layout: fresh copy of torch_xla at <torch>/xla", ("rm", "-rf", spec.torch_xla_tree)),
        Step(
            "layout: copy",
            ("cp", "-a", spec.torch_xla_worktree, spec.torch_xla_tree),
            note="upstream's pytorch/xla layout; Bazel loads PyTorch from ../",
        ),
        Step(
            "torch_xla's openxla_patches/ onto the OpenXLA checkout",
            action="apply-openxla-patches",
            args=(spec.torch_xla_tree, spec.openxla_src),
            note="each `patch -p1 -l -i <file>` of WORKSPACE's xla http_archive, which "
            "--override_repository bypasses",
        ),
        Step(
            "write .bazelrc.user",
            action="write-file",
            args=(f"{spec.torch_xla_tree}/.bazelrc.user", bazelrc_user(spec)),
        ),
        *([auth_step] if auth_rc else []),
        Step(
            "torch_xla wheel",
            (spec.python, "setup.py", "bdist_wheel", "--dist-dir", tmp),
            env=env,
            cwd=spec.torch_xla_tree,
            path_prepend=(f"{spec.buildenv}/bin",),
            git_dir_for=spec.torch_src,
            note=TORCH_GIT_DIR_NOTE,
        ),
        Step("stamp provenance into the wheel", action="stamp-provenance", args=(tmp,)),
        Step(
            "finish torch_xla stage",
            action="finish-stage",
            args=(tmp, spec.torch_xla_stage, "torch_xla"),
        ),
    ]


def ship_steps(spec: BuildSpec, staging: str) -> list[Step]:
    """A clean environment with only the staged wheels, then the configured check."""
    venv_python = f"{spec.ship_env}/bin/python"
    values = {
        "python": venv_python,
        "wheels": staging,
        "out": spec.ship_out,
        "builder_python": spec.python,
        "torch_xla_src": spec.torch_xla_tree,
    }
    pip_args = tuple(arg.format(**values) for arg in spec.ship_pip_args)
    # Split into words first, then fill each: a path holding a space stays one argument.
    check = tuple(word.format(**values) for word in shlex.split(spec.ship_check))
    env = {
        "PIP_CACHE_DIR": spec.pip_cache_dir,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        **spec.extra_env,
    }
    # The gate runs from the pipeline's own sources (mounted read-only at the same path).
    check_env = {**env, "PYTHONPATH": ":".join(spec.pipeline_src)}
    # pip refuses by itself too, should the venv break after the check (venv_check).
    install_env = {**env, **venv_check.PIP_REQUIRE_VIRTUALENV}
    return [
        Step(
            "clean environment",
            (spec.python, "-m", "venv", "--clear", "--without-pip", spec.ship_env),
        ),
        Step(
            "check that its python is the venv",
            action="check-venv",
            args=(spec.ship_env,),
            note="sys.prefix: a venv without pyvenv.cfg would install into the base interpreter",
        ),
        Step(
            "pip for it",
            action="pip-from-bundle",
            args=(spec.ship_env, f"{spec.pip_cache_dir}/{venv_check.BUNDLED_PIP_DIR}"),
            note="the pip venv installs, from ensurepip's wheel: 3 s less CPU per check",
        ),
        Step(
            "install the staged wheels",
            (venv_python, "-m", "pip", "install", *pip_args, f"{staging}/*.whl"),
            env=_sorted_env(install_env),
            expand=(f"{staging}/*.whl",),
        ),
        Step("ship check", check, env=_sorted_env(check_env), cwd=spec.ship_out),
    ]


def recipe(spec: BuildSpec, name: str, staging: str | None = None) -> list[Step]:
    if name == "torch":
        return torch_steps(spec)
    if name == "torch_xla":
        return torch_xla_steps(spec)
    if name == "ship":
        return ship_steps(spec, staging or "<staging>")
    raise ValueError(f"unknown recipe {name!r}")


def expand_argv(step: Step) -> list[str]:
    argv: list[str] = []
    for arg in step.argv:
        if arg in step.expand:
            directory, pattern = os.path.split(arg)
            matches = sorted(str(p) for p in Path(directory).glob(pattern))
            if not matches:
                raise FileNotFoundError(f"nothing matches {arg}")
            argv.extend(matches)
        else:
            argv.append(arg)
    return argv
