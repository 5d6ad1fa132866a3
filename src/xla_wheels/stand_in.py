"""The stand-in upstream: three tiny git repositories with the real build interface.

"torch", "torch_xla" and "openxla", made with real git, each a few lines of Python that
say they are NOT PyTorch. ``make demo`` builds them end to end (:mod:`xla_wheels.demo`)
and the tests build them too (``tests/synthetic_upstream.py``): one stand-in, so the
demo shows what the tests prove. Their setup.py files honour the environment the recipes
set (PYTORCH_BUILD_VERSION, USE_CUDA, TORCH_XLA_VERSION, GIT_VERSIONED_XLA_BUILD, ...),
expect what upstream expects (torch_xla built inside the PyTorch tree at ``<torch>/xla``,
torch installed in the build environment, ``.bazelrc.user``'s
``--override_repository=xla=`` naming an OpenXLA checkout with torch_xla's
``openxla_patches/`` applied) and fail loudly otherwise. They produce real wheels with
setuptools: everything around the compile is proven, not the compile itself, which only
a builder with Bazel and the real sources can run.

The stand-in torch_xla has the persistent-cache defect in miniature
(``torch_xla.load_cache()`` returns False); the series' ``torch_xla/0001-load-cache.patch``
fixes it, and :data:`SHIP_CHECK` runs it, so a build passes only when patched.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from xla_host import runner
from xla_host.errors import PipelineError

NOTICE = "{who} stand-in upstream (xla_wheels.stand_in): this is NOT {what}."

# The build's ship check suited to stand-in wheels: the fixed defect, and the provenance
# file read at runtime from the installed package.
SHIP_CHECK = (
    '{python} -c "import importlib.resources, json, sys, torch_xla; '
    "p = json.loads(importlib.resources.files('torch_xla')"
    ".joinpath('_xla_wheels_provenance.json').read_text()); "
    "print('provenance torch_xla', p['components']['torch_xla']['commit']); "
    'sys.exit(0 if torch_xla.load_cache() else 1)"'
)

# In the templates below "<who>" names the stand-in in its messages ("demo" or
# "synthetic") and "<notice>" is its NOTICE.
TORCH_SETUP = """
# <notice>
import os, subprocess, sysconfig
from setuptools import Extension, setup

version = os.environ["PYTORCH_BUILD_VERSION"]  # KeyError = the recipe forgot it
for flag in ("USE_CUDA", "USE_ROCM", "USE_XPU", "USE_MPS", "BUILD_TEST"):
    if os.environ.get(flag) != "0":
        raise SystemExit(f"<who> torch: {flag} must be 0 for a TPU build")
# A build system that echoes its compiler-cache setup (CMake's verbose output does):
# the pipeline must keep the credential in this value out of the log.
print("<who> torch: ccache remote storage", os.environ.get("CCACHE_REMOTE_STORAGE", "none"))
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
setup(name="torch", version=version, packages=["torch"], ext_modules=ext_modules,
      description="<notice>")
"""

# The C extension of the stand-in torch (make_stand_in(..., c_extension=True)).
TORCH_C_EXTENSION = """
#include <Python.h>

static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }

static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
"""

TORCH_INIT = '''
"""<notice>"""
from torch.version import __version__, git_version

DEMONSTRATION = True
'''


def bazelrc_words(line: str) -> list[str]:
    """The words Bazel reads from one line of an rc file, by the rules of its client's
    ``blaze_util::Tokenize`` (src/main/cpp/util/strings.cc): whitespace separates words,
    ``'`` and ``"`` group, a backslash takes the next character as it is (inside quotes
    too), and ``#`` outside quotes ends the line. The stand-in torch_xla's reader."""
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
# <notice>
import os, re, subprocess
from setuptools import setup

# <bazelrc_words>

base = os.path.dirname(os.path.abspath(__file__))
# Like upstream: PyTorch's source tree one level up (bazel/dependencies.bzl "../").
if not os.path.isfile(os.path.join(base, "..", "torch", "__init__.py")):
    raise SystemExit("<who> torch_xla: PyTorch's source tree is not at ../")
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
print("<who> torch_xla: PyTorch Commit ID:", torch_sha or "(none)")
version = os.getenv("TORCH_XLA_VERSION", "2.9.0")
if os.getenv("GIT_VERSIONED_XLA_BUILD", "TRUE").upper() in ("1", "TRUE", "ON", "YES", "Y"):
    version += "+git" + sha[:7]
# .bazelrc.user read as Bazel reads it: line by line, each line as words (the pipeline
# double-quotes a path holding a space).
rc = [bazelrc_words(line) for line in open(os.path.join(base, ".bazelrc.user"), encoding="utf-8")]
# Remote-cache credentials, as Bazel would read them: the try-imported private rc file.
for auth in [words[1] for words in rc if words[:1] == ["try-import"]]:
    if os.stat(auth).st_mode & 0o077:
        raise SystemExit(f"<who> torch_xla: {auth} is readable by others")
    # What `bazel --announce_rc` would print: the pipeline must keep it out of the log.
    print("<who> torch_xla: announce_rc", open(auth).read().strip())
override = next(
    word.split("=", 2)[2]
    for words in rc
    for word in words
    if word.startswith("--override_repository=xla=")
)
core = open(os.path.join(override, "xla", "core.h")).read()
if "TORCH_XLA_OPENXLA_PATCH" not in core:
    raise SystemExit("<who> torch_xla: openxla_patches/ not applied to the override")
for key in ("BUILD_CPP_TESTS", "BUNDLE_LIBTPU", "TPUVM_MODE", "CXX_ABI", "BAZEL_DISK_CACHE_PATH"):
    if key not in os.environ:
        raise SystemExit(f"<who> torch_xla: {key} not set")
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
      install_requires=[f"torch=={torch.__version__}"], description="<notice>")
"""

XLA_INIT = '''
"""<notice>"""
from torch_xla.version import __version__

DEMONSTRATION = True


def load_cache():
    """Whether a warm restart loads the persistent cache (the defect: it does not)."""
    return False
'''

WORKSPACE = """
# <notice>
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

CORE_H = "// <notice>\nint api_version = 1;\n"

# Fixed identities and dates: the stand-in's commits are the same on every run.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "xla-wheels stand-in",
    "GIT_AUTHOR_EMAIL": "stand-in@example.invalid",
    "GIT_COMMITTER_NAME": "xla-wheels stand-in",
    "GIT_COMMITTER_EMAIL": "stand-in@example.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


@dataclass(frozen=True)
class StandIn:
    """The repositories ``make_stand_in`` wrote and the commit each one's ``main`` is at."""

    repos: dict[str, Path]
    """Component (torch, torch_xla, openxla) -> its repository."""
    commits: dict[str, str]
    who: str

    def patch(self, component: str, subject: str, edits: Mapping[str, str], out: Path) -> None:
        """One patch of the series on ``component``'s commit, in the pipeline's format
        (header + git diff), made with real git; the repository is left as it was."""
        repo = self.repos[component]
        write_patch(repo, self.commits[component], component, subject, edits, out, self.who)

    def write_series(self, patches: Path) -> None:
        """The series both stand-ins carry under ``patches``: the fix of the defect
        (``torch_xla/0001-load-cache.patch``) and an OpenXLA API change
        (``openxla/0001-api.patch``)."""
        fixed = self.text(XLA_INIT, "PyTorch/XLA").replace("return False", "return True")
        self.patch(
            "torch_xla", "load the persistent cache", {"torch_xla/__init__.py": fixed},
            patches / "torch_xla" / "0001-load-cache.patch",
        )  # fmt: skip
        self.patch(
            "openxla", "a local API change", {"xla/api.h": "int api = 2;\n"},
            patches / "openxla" / "0001-api.patch",
        )  # fmt: skip

    def text(self, template: str, what: str) -> str:
        """A template as this stand-in writes it."""
        notice = NOTICE.format(who=self.who, what=what)
        body = textwrap.dedent(template).lstrip("\n")
        return body.replace("<notice>", notice).replace("<who>", self.who)


def git(cwd: Path, *args: str) -> str:
    """Run git with the stand-in's fixed identity and dates; its output."""
    argv = ["git", "-c", "init.defaultBranch=main", *args]

    def failed(result: subprocess.CompletedProcess[str]) -> PipelineError:
        return PipelineError(
            f"git {' '.join(args)} failed in {cwd}: {result.stderr.strip()}",
            fix="check that git works here (`git --version`); the stand-in needs nothing else",
        )

    return runner.run(argv, cwd=cwd, env=GIT_ENV, echo="none", error=failed).stdout


def _repo(path: Path, files: Mapping[str, str]) -> str:
    path.mkdir(parents=True)
    git(path, "init", "-q")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "stand-in upstream (NOT PyTorch)")
    return git(path, "rev-parse", "HEAD").strip()


def write_patch(
    repo: Path,
    commit: str,
    component: str,
    subject: str,
    edits: Mapping[str, str],
    out: Path,
    who: str = "synthetic",
) -> None:
    """A patch in the pipeline's format (header + git diff) of ``edits`` to ``repo``'s
    work tree at ``commit``, made with real git; the work tree is left as it was."""
    for name, text in edits.items():
        (repo / name).write_text(text)
    diff = git(repo, "diff")
    git(repo, "checkout", "--quiet", "--", ".")
    header = (
        f"Subject: {subject}\nComponent: {component}\nBase: {commit}\n"
        f"Fixes: the {who} defect\nWhy: the {who} stand-in's patch series\n"
        f"Upstream: not upstreamed ({who} stand-in)\nFiles: {', '.join(edits)}\n\n"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + diff + "\n")


def make_stand_in(
    upstream: Path, *, who: str, xla_dir: str = "torch_xla", c_extension: bool = False
) -> StandIn:
    """The three repositories under ``upstream`` (torch_xla's in ``xla_dir``), their
    messages naming them ``who``; ``c_extension`` gives torch a C extension compiled
    through the recipe's compiler launcher (needs a C compiler, the Python headers and
    ccache)."""
    names = {"torch": "PyTorch", "torch_xla": "PyTorch/XLA", "openxla": "OpenXLA"}
    stand_in = StandIn(
        repos={
            "torch": upstream / "torch",
            "torch_xla": upstream / xla_dir,
            "openxla": upstream / "openxla",
        },
        commits={},
        who=who,
    )

    def files(component: str, templates: Mapping[str, str]) -> dict[str, str]:
        what = names[component]
        readme = {"README": NOTICE.format(who=who, what=what) + "\n"}
        return {name: stand_in.text(text, what) for name, text in templates.items()} | readme

    torch = {
        "setup.py": TORCH_SETUP,
        "torch/__init__.py": TORCH_INIT,
        # As pytorch/pytorch's .gitignore: what `setup.py bdist_wheel` leaves in the tree.
        ".gitignore": "build/\ntorch.egg-info/\ntorch/version.py\n",
    }
    if c_extension:
        torch["csrc/synthetic.c"] = TORCH_C_EXTENSION
    core_h = stand_in.text(CORE_H, "OpenXLA")
    openxla = stand_in.repos["openxla"]
    stand_in.commits["torch"] = _repo(stand_in.repos["torch"], files("torch", torch))
    stand_in.commits["openxla"] = _repo(
        openxla, files("openxla", {"xla/core.h": CORE_H, "xla/api.h": "int api = 1;\n"})
    )
    # torch_xla's own openxla_patches/no_fortify.diff, as upstream ships it: a plain diff
    # applied with `patch -p1 -l`.
    (openxla / "xla" / "core.h").write_text(core_h + "// TORCH_XLA_OPENXLA_PATCH\n")
    fortify = git(openxla, "diff")
    git(openxla, "checkout", "--quiet", "--", ".")
    xla_setup = XLA_SETUP.replace("# <bazelrc_words>", inspect.getsource(bazelrc_words))
    xla = {
        "setup.py": xla_setup,
        "torch_xla/__init__.py": XLA_INIT,
        "WORKSPACE": WORKSPACE,
        "bazel/dependencies.bzl": 'PYTORCH_LOCAL_DIR = "../"\n',
        ".bazelversion": "7.4.1\n",
        "openxla_patches/BUILD": "",
        ".gitignore": "build/\ntorch_xla.egg-info/\ntorch_xla/version.py\n",
    }
    xla_files = files("torch_xla", xla) | {"openxla_patches/no_fortify.diff": fortify + "\n"}
    stand_in.commits["torch_xla"] = _repo(stand_in.repos["torch_xla"], xla_files)
    return stand_in


def wheels_flags(cache: Path) -> dict[str, str]:
    """``wheels``' flags for a stand-in build, sized for a small machine (1 job, tiny
    disk, no compiler cache), its ship check :data:`SHIP_CHECK`."""
    return {
        "--cache-dir": str(cache),
        "--jobs": "1",
        "--min-disk-gib": "1",
        "--mem-per-job-gib": "0.5",
        "--mem-base-gib": "0.5",
        "--host-tools": "git,patch",
        "--compiler-env": "",
        "--ship-check": SHIP_CHECK,
        "--ship-pip-args": "--no-index --find-links {wheels}",
    }
