"""The one wheel file name reader: packaging's check on the host, the same answers without it."""

from __future__ import annotations

import inspect
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from xla_host.wheel_filename import HAVE_PACKAGING, WheelFilenameError, WheelName, parse_wheel_name

SRC = Path(__file__).resolve().parents[1] / "host" / "src"

VALID = [
    ("torch_xla-2.9.0+gitc04e61c.p1a2b3c4d-cp311-cp311-linux_x86_64.whl",
     ("torch_xla", "2.9.0+gitc04e61c.p1a2b3c4d", None, "cp311", "cp311", "linux_x86_64")),
    ("torch_xla-2.9.0+gitc04e61c.p1a2b3c4d-1-cp313-cp313-manylinux_2_28_x86_64.whl",
     ("torch_xla", "2.9.0+gitc04e61c.p1a2b3c4d", "1", "cp313", "cp313", "manylinux_2_28_x86_64")),
    ("demo-1.0-py3-none-any.whl", ("demo", "1.0", None, "py3", "none", "any")),
    ("six-1.16.0-py2.py3-none-any.whl", ("six", "1.16.0", None, "py2.py3", "none", "any")),
    ("Foo.Bar-1!2.0rc1.post3.dev4-12abc-py3-none-any.whl",
     ("Foo.Bar", "1!2.0rc1.post3.dev4", "12abc", "py3", "none", "any")),
    ("jaxlib-0.9.0-cp313-cp313-manylinux_2_27_x86_64.whl",
     ("jaxlib", "0.9.0", None, "cp313", "cp313", "manylinux_2_27_x86_64")),
    ("torch-2.9.0a0+git1a2b3c4-py3-none-any.whl",
     ("torch", "2.9.0a0+git1a2b3c4", None, "py3", "none", "any")),
    ("x-v1.0_post_2-py3-none-any.whl", ("x", "v1.0_post_2", None, "py3", "none", "any")),
]  # fmt: skip

INVALID = [
    "torch-2.9.0-py3-none.whl",  # too few parts
    "torch-2.9.0-1-2-py3-none-any.whl",  # too many parts
    "torch-not.a.version-py3-none-any.whl",
    "torch-2.9.0+-py3-none-any.whl",  # empty local label
    "torch-2.9.0-x1-py3-none-any.whl",  # build tag must start with a digit
    "torch__xla-2.9.0-py3-none-any.whl",  # PEP 427 escapes a name with one underscore
    "torch+xla-2.9.0-py3-none-any.whl",
    "-2.9.0-py3-none-any.whl",  # empty project
    "torch-2.9.0-3py-none-any.whl",  # the interpreter tag is not an identifier
    "torch-2.9.0-py3..py2-none-any.whl",  # an empty member of a compressed tag set
    "torch-2.9.0-py3--any.whl",  # an empty abi tag
]

PATHS = [pytest.param(False, id="standard-library")] + (
    [pytest.param(True, id="packaging")] if HAVE_PACKAGING else []
)


def test_the_host_checks_with_packaging() -> None:
    # The pipeline's environment declares packaging, at a version installed here, so a
    # host call (no with_packaging given) takes packaging's check, never the fallback.
    project = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())["project"]
    [declared] = [
        Requirement(line)
        for line in project["dependencies"]
        if canonicalize_name(Requirement(line).name) == "packaging"
    ]
    assert declared.specifier.contains(metadata.version("packaging"))
    assert inspect.signature(parse_wheel_name).parameters["with_packaging"].default is True


@pytest.mark.parametrize("with_packaging", PATHS)
@pytest.mark.parametrize(("filename", "parts"), VALID, ids=[v[0] for v in VALID])
def test_a_valid_name_gives_its_parts_as_written(
    filename: str, parts: tuple[str, ...], with_packaging: bool
) -> None:
    name = parse_wheel_name(filename, with_packaging=with_packaging)
    assert (name.project, name.version, name.build, name.python, name.abi, name.platform) == parts
    assert name.filename == filename


@pytest.mark.parametrize("filename", INVALID)
def test_both_paths_reject_a_bad_name_with_the_same_error(filename: str) -> None:
    errors = []
    for with_packaging in (False, True) if HAVE_PACKAGING else (False,):
        with pytest.raises(WheelFilenameError) as caught:
            parse_wheel_name(filename, with_packaging=with_packaging)
        errors.append((str(caught.value), caught.value.exit_code))
    assert len(set(errors)) == 1
    assert "is not a valid wheel file name" in errors[0][0]
    assert "fix: rebuild the wheel" in errors[0][0]


@pytest.mark.parametrize("with_packaging", PATHS)
def test_a_file_that_is_no_wheel_is_named_so(with_packaging: bool) -> None:
    with pytest.raises(WheelFilenameError, match="is not a wheel file name"):
        parse_wheel_name("torch-2.9.0.tar.gz", with_packaging=with_packaging)
    # The builder image's callers catch ValueError.
    with pytest.raises(ValueError):
        parse_wheel_name("torch.whl", with_packaging=with_packaging)


def test_normalized_name_and_build_tag_replacement() -> None:
    name = parse_wheel_name("Torch_XLA-2.9.0-7-cp311-cp311-linux_x86_64.whl")
    assert name.normalized == "torch-xla"
    assert name.with_build("8") == "Torch_XLA-2.9.0-8-cp311-cp311-linux_x86_64.whl"
    assert isinstance(name, WheelName)


def test_the_bare_interpreter_parses_without_packaging() -> None:
    # -S: no site-packages, as in the builder image and the gate's receipt step.
    script = (
        "from xla_host import wheel_filename as w\n"
        "n = w.parse_wheel_name('demo-1.0-1-py3-none-any.whl')\n"
        "print(w.HAVE_PACKAGING, n.project, n.version, n.build)\n"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", script],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "demo", "1.0", "1"]
