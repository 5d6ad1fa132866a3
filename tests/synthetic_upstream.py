"""A synthetic upstream with the real build interface, for the build-stage tests.

Three tiny git repositories made with real git: "torch", "torch_xla" and "openxla". Their
setup.py files honour the environment the recipes set (PYTORCH_BUILD_VERSION, USE_CUDA,
TORCH_XLA_VERSION, GIT_VERSIONED_XLA_BUILD, ...), expect what upstream expects (torch_xla
built inside the PyTorch tree at ``<torch>/xla``, torch installed in the build
environment, ``.bazelrc.user``'s ``--override_repository=xla=`` naming an OpenXLA checkout
with torch_xla's ``openxla_patches/`` applied) and fail loudly otherwise. They produce real
wheels with setuptools. This is test data: it proves everything around the compile, not
the compile itself, which only a builder with Bazel and the real sources can run.

The synthetic torch_xla has the persistent-cache defect in miniature
(``torch_xla.load_cache()`` returns False); ``patches/torch_xla/0001-*.patch`` fixes it,
so the ship check below passes only for a patched build.
"""

from __future__ import annotations

import inspect
import json
import shutil
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.bundles import Pin, write_bundle
from tests.gitrepos import git, make_repo

PYTHON_MINOR = f"{sys.version_info[0]}.{sys.version_info[1]}"

# The ship check suited to synthetic wheels: the warm-restart fix in miniature, plus the
# provenance file read at runtime from the installed package.
SHIP_CHECK = (
    '{python} -c "import importlib.resources, json, sys, torch_xla; '
    "p = json.loads(importlib.resources.files('torch_xla')"
    ".joinpath('_xla_wheels_provenance.json').read_text()); "
    "print('provenance torch_xla', p['components']['torch_xla']['commit']); "
    'sys.exit(0 if torch_xla.load_cache() else 1)"'
)

TORCH_SETUP = """
import os, subprocess, sysconfig
from setuptools import Extension, setup

version = os.environ["PYTORCH_BUILD_VERSION"]  # KeyError = the recipe forgot it
for flag in ("USE_CUDA", "USE_ROCM", "USE_XPU", "USE_MPS", "BUILD_TEST"):
    if os.environ.get(flag) != "0":
        raise SystemExit(f"synthetic torch: {flag} must be 0 for a TPU build")
# A build system that echoes its compiler-cache setup (CMake's verbose output does):
# the pipeline must keep the credential in this value out of the log.
print("synthetic torch: ccache remote storage", os.environ.get("CCACHE_REMOTE_STORAGE", "none"))
sha = subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()
with open("torch/version.py", "w") as f:
    f.write(f"__version__ = {version!r}\\ngit_version = {sha!r}\\n")
ext_modules = []
if os.path.exists("csrc/synthetic.c"):
    # Like PyTorch's CMake build, where CMake (>= 3.17) takes the compiler launcher from
    # CMAKE_C_COMPILER_LAUNCHER in the environment: every compile runs through it.
    launcher = os.environ["CMAKE_C_COMPILER_LAUNCHER"]  # KeyError = the recipe forgot it
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC")
    os.environ["CC"] = f"{launcher} {cc}"
    ext_modules = [Extension("torch._C", ["csrc/synthetic.c"])]
setup(name="torch", version=version, packages=["torch"], ext_modules=ext_modules)
"""

# The C extension of the synthetic torch (make_synthetic(..., c_extension=True)).
TORCH_C_EXTENSION = """
#include <Python.h>

static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }

static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
"""

TORCH_INIT = """
from torch.version import __version__, git_version
"""


def bazelrc_words(line: str) -> list[str]:
    """The words Bazel reads from one line of an rc file, by the rules of its client's
    ``blaze_util::Tokenize`` (src/main/cpp/util/strings.cc): whitespace separates words,
    ``'`` and ``"`` group, a backslash takes the next character as it is (inside quotes
    too), and ``#`` outside quotes ends the line. A test's reader, like Bazel's."""
    words: list[str] = []
    word, quote, index = "", "", 0
    while index < len(line):
        char = line[index]
        if char == "\\":
            word += line[index + 1 : index + 2]
            index += 2
            continue
        if quote:
            if char == quote:
                quote = ""
            else:
                word += char
        elif char in " \t\r\n":
            if word:
                words.append(word)
            word = ""
        elif char == "#":
            break
        elif char in "'\"":
            quote = char
        else:
            word += char
        index += 1
    if word:
        words.append(word)
    return words


XLA_SETUP = """
import os, re, subprocess
from setuptools import setup

# <bazelrc_words>

base = os.path.dirname(os.path.abspath(__file__))
# Like upstream: PyTorch's source tree one level up (bazel/dependencies.bzl "../").
if not os.path.isfile(os.path.join(base, "..", "torch", "__init__.py")):
    raise SystemExit("synthetic torch_xla: PyTorch's source tree is not at ../")
import torch  # installed into the build environment by the recipe
sha = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=base, text=True).strip()
# As upstream's get_git_head_sha (setup.py at c04e61c): torch's revision only when ../.git
# is a directory, else ''. It becomes TORCH_GITREV, part of every compilation-cache key.
if os.path.isdir(os.path.join(base, "..", ".git")):
    torch_sha = subprocess.check_output(
        ["git", "rev-parse", "HEAD"], cwd=os.path.join(base, ".."), text=True
    ).strip()
else:
    torch_sha = ""
# A recipe's output, streamed to the terminal inside the build's folded section.
print("synthetic torch_xla: PyTorch Commit ID:", torch_sha or "(none)")
version = os.getenv("TORCH_XLA_VERSION", "2.9.0")
if os.getenv("GIT_VERSIONED_XLA_BUILD", "TRUE").upper() in ("1", "TRUE", "ON", "YES", "Y"):
    version += "+git" + sha[:7]
# .bazelrc.user read as Bazel reads it: line by line, each line as words.
rc = [bazelrc_words(line) for line in open(os.path.join(base, ".bazelrc.user"), encoding="utf-8")]
# Remote-cache credentials, as Bazel would read them: the try-imported private rc file.
for auth in [words[1] for words in rc if words[:1] == ["try-import"]]:
    if os.stat(auth).st_mode & 0o077:
        raise SystemExit(f"synthetic torch_xla: {auth} is readable by others")
    # What `bazel --announce_rc` would print: the pipeline must keep it out of the log.
    print("synthetic torch_xla: announce_rc", open(auth).read().strip())
override = next(
    word.split("=", 2)[2]
    for words in rc
    for word in words
    if word.startswith("--override_repository=xla=")
)
core = open(os.path.join(override, "xla", "core.h")).read()
if "TORCH_XLA_OPENXLA_PATCH" not in core:
    raise SystemExit("synthetic torch_xla: openxla_patches/ not applied to the override")
for key in ("BUILD_CPP_TESTS", "BUNDLE_LIBTPU", "TPUVM_MODE", "CXX_ABI", "BAZEL_DISK_CACHE_PATH"):
    if key not in os.environ:
        raise SystemExit(f"synthetic torch_xla: {key} not set")
# Test hook: a build step that runs long, for Ctrl-C tests. It leaves its pid in the file
# named and sleeps. Off unless a test asks for it.
if os.environ.get("SYNTHETIC_SLOW_BUILD_PIDFILE"):
    import time
    with open(os.environ["SYNTHETIC_SLOW_BUILD_PIDFILE"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(300)
# Test hook: a build step that waits for a file before it goes on, for a recipe that
# outlives its run (its CLI killed with SIGKILL). Its pid in "<file>.pid". Off unless asked.
if os.environ.get("SYNTHETIC_BUILD_WAITS_FOR"):
    import time
    go = os.environ["SYNTHETIC_BUILD_WAITS_FOR"]
    with open(go + ".pid", "w") as f:
        f.write(str(os.getpid()))
    while not os.path.exists(go):
        time.sleep(0.1)
# Test hook: a compiler that makes different bytes from the same inputs (timestamps,
# parallel link order) in miniature. Off unless a test asks for it.
if os.environ.get("SYNTHETIC_NONDETERMINISTIC_BUILD") == "1":
    with open(os.path.join(base, "torch_xla", "_compiled.py"), "w") as f:
        f.write(f"RANDOM_BYTES = {os.urandom(8).hex()!r}\\n")
with open(os.path.join(base, "torch_xla", "version.py"), "w") as f:
    f.write(f"__version__ = {version!r}\\n__xla_gitrev__ = {sha!r}\\n")
    f.write(f"__torch_gitrev__ = {torch_sha!r}\\n__openxla_core__ = {core!r}\\n")
setup(name="torch_xla", version=version, packages=["torch_xla"],
      install_requires=[f"torch=={torch.__version__}"])
"""

XLA_INIT = """
from torch_xla.version import __version__


def load_cache():
    \"\"\"Whether a warm restart loads the persistent cache (the defect: it does not).\"\"\"
    return False
"""

WORKSPACE = """
load("//bazel:dependencies.bzl", "PYTORCH_LOCAL_DIR")

http_archive(
    name = "xla",
    patch_args = [
        "-l",
        "-p1",
    ],
    patch_tool = "patch",
    patches = [
        "//openxla_patches:no_fortify.diff",
    ],
    strip_prefix = "xla-" + xla_hash,
)
"""

CORE_H = "// synthetic OpenXLA core\nint api_version = 1;\n"


# Fixed dates: the synthetic commits are the same on every run.
SYNTHETIC_DATES = {
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z",
}


def _repo(path: Path, files: dict[str, str]) -> str:
    texts = {name: textwrap.dedent(text).lstrip("\n") for name, text in files.items()}
    return make_repo(path, texts, "synthetic", env=SYNTHETIC_DATES)


def make_patch(
    repo: Path, commit: str, component: str, subject: str, edits: dict[str, str], out: Path
) -> None:
    """A patch in the pipeline's format (header + git diff), made with real git."""
    for name, text in edits.items():
        (repo / name).write_text(text)
    diff = git(repo, "diff", env=SYNTHETIC_DATES)
    git(repo, "checkout", "--quiet", "--", ".", env=SYNTHETIC_DATES)
    header = (
        f"Subject: {subject}\nComponent: {component}\nBase: {commit}\n"
        "Fixes: synthetic defect\nWhy: test data for the build stage\n"
        f"Upstream: not upstreamed (synthetic)\nFiles: {', '.join(edits)}\n\n"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + diff + "\n")


@dataclass
class Synthetic:
    root: Path
    """The throwaway project root (build/bundles, patches/, wheels.lock, dist/)."""
    cache: Path
    upstream: Path
    commits: dict[str, str]

    def bundle_path(self, name: str = "syn") -> Path:
        return self.root / "build" / "bundles" / f"{name}.toml"

    def write_bundle(
        self,
        name: str = "syn",
        *,
        xla_patches: tuple[str, ...] = (
            "torch_xla/0001-load-cache.patch",
            "torch_xla/0002-comment.patch",
        ),
        openxla_commit: str | None = None,
        openxla_patches: tuple[str, ...] = ("openxla/0001-api.patch",),
        torch_patches: tuple[str, ...] = (),
    ) -> Path:
        pins = {
            "torch": Pin(
                str(self.upstream / "torch"),
                self.commits["torch"],
                "2.9.0a0",
                torch_patches,
                submodules=False,
            ),
            "torch_xla": Pin(
                str(self.upstream / "xla"), self.commits["torch_xla"], "2.9.0", xla_patches
            ),
            "openxla": Pin(
                str(self.upstream / "openxla"),
                openxla_commit or self.commits["openxla"],
                patches=openxla_patches,
            ),
        }
        return write_bundle(
            self.root,
            name,
            pins,
            python=PYTHON_MINOR,
            description="synthetic upstream (test data)",
            build={
                "bundle_libtpu": False,
                "tpuvm_mode": True,
                "build_cpp_tests": False,
                "cxx_abi": 1,
            },
        )


def make_synthetic(base: Path, *, c_extension: bool = False) -> Synthetic:
    """The three repositories and a project root; ``c_extension`` gives torch a C
    extension compiled through the recipe's compiler launcher (needs a C compiler, the
    Python headers and ccache)."""
    upstream = base / "upstream"
    torch_files = {
        "setup.py": TORCH_SETUP,
        "torch/__init__.py": TORCH_INIT,
        # As pytorch/pytorch's .gitignore: what `setup.py bdist_wheel` leaves in the tree.
        ".gitignore": "build/\ntorch.egg-info/\ntorch/version.py\n",
    }
    if c_extension:
        torch_files["csrc/synthetic.c"] = TORCH_C_EXTENSION
    commits = {
        "torch": _repo(upstream / "torch", torch_files),
        "torch_xla": _repo(
            upstream / "xla",
            {
                "setup.py": XLA_SETUP.replace(
                    "# <bazelrc_words>", inspect.getsource(bazelrc_words)
                ),
                "torch_xla/__init__.py": XLA_INIT,
                "WORKSPACE": WORKSPACE,
                "bazel/dependencies.bzl": 'PYTORCH_LOCAL_DIR = "../"\n',
                ".bazelversion": "7.4.1\n",
                "openxla_patches/BUILD": "",
            },
        ),
        "openxla": _repo(
            upstream / "openxla", {"xla/core.h": CORE_H, "xla/api.h": "int api = 1;\n"}
        ),
    }
    xla_repo = upstream / "xla"
    # torch_xla's own openxla_patches/no_fortify.diff, as upstream ships it: a plain diff
    # applied with `patch -p1 -l` (committed in the torch_xla repo).
    openxla_repo = upstream / "openxla"
    (openxla_repo / "xla" / "core.h").write_text(CORE_H + "// TORCH_XLA_OPENXLA_PATCH\n")
    fortify = git(openxla_repo, "diff", env=SYNTHETIC_DATES)
    git(openxla_repo, "checkout", "--quiet", "--", ".", env=SYNTHETIC_DATES)
    (xla_repo / "openxla_patches" / "no_fortify.diff").write_text(fortify + "\n")
    git(xla_repo, "add", "-A", env=SYNTHETIC_DATES)
    git(xla_repo, "commit", "--quiet", "-m", "openxla_patches", env=SYNTHETIC_DATES)
    commits["torch_xla"] = git(xla_repo, "rev-parse", "HEAD", env=SYNTHETIC_DATES)

    root = base / "project"
    (root / "build" / "bundles").mkdir(parents=True)
    patches = root / "patches"
    fixed = XLA_INIT.replace("return False", "return True")
    make_patch(
        xla_repo,
        commits["torch_xla"],
        "torch_xla",
        "load serialized executables",
        {"torch_xla/__init__.py": textwrap.dedent(fixed).lstrip("\n")},
        patches / "torch_xla" / "0001-load-cache.patch",
    )
    make_patch(
        xla_repo,
        commits["torch_xla"],
        "torch_xla",
        "a second, harmless patch",
        {"WORKSPACE": textwrap.dedent(WORKSPACE).lstrip("\n") + "# patched\n"},
        patches / "torch_xla" / "0002-comment.patch",
    )
    make_patch(
        openxla_repo,
        commits["openxla"],
        "openxla",
        "local API patch",
        {"xla/api.h": "int api = 2;\n"},
        patches / "openxla" / "0001-api.patch",
    )
    cache = base / "cache"
    synthetic = Synthetic(root=root, cache=cache, upstream=upstream, commits=commits)
    synthetic.write_bundle()
    return synthetic


def save_synthetic(syn: Synthetic, path: Path) -> None:
    """What ``load_synthetic`` needs besides the directories: the commits."""
    path.write_text(json.dumps(syn.commits))


def load_synthetic(base: Path, saved: Path) -> Synthetic:
    """The project ``make_synthetic(base)`` made, its commits read from ``saved``."""
    commits = json.loads(saved.read_text())
    return Synthetic(base / "project", base / "cache", base / "upstream", commits)


def copy_synthetic(template: Synthetic, base: Path) -> Synthetic:
    """A private copy in ``base`` of a project ``make_synthetic`` made: the same commits
    (fixed dates), its bundle naming the copy's repositories. Cheaper than making it again,
    and a test may change its copy freely."""
    upstream, root = base / "upstream", base / "project"
    shutil.copytree(template.upstream, upstream, symlinks=True)
    shutil.copytree(template.root, root, symlinks=True)
    commits = dict(template.commits)
    copy = Synthetic(root=root, cache=base / "cache", upstream=upstream, commits=commits)
    copy.write_bundle()
    return copy


def cli_args(syn: Synthetic, *extra: str, bundle: str = "syn") -> list[str]:
    """`xla-wheels wheels` for the synthetic root, sized for a test (1 job, tiny disk)."""
    return [
        "wheels",
        "--root",
        str(syn.root),
        "--cache-dir",
        str(syn.cache),
        "--bundle",
        bundle,
        "--jobs",
        "1",
        "--min-disk-gib",
        "1",
        "--mem-per-job-gib",
        "0.5",
        "--mem-base-gib",
        "0.5",
        "--host-tools",
        "git,patch",
        "--compiler-env",
        "",
        "--ship-check",
        SHIP_CHECK,
        "--ship-pip-args",
        "--no-index --find-links {wheels}",
        *extra,
    ]
