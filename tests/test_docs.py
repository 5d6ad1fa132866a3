"""The documentation: README.md is the five-minute start, docs/ the rest by topic, built as
a site by MkDocs (mkdocs.yml). The build is strict, so a broken link, an anchor that no
heading has, or a page left out of the nav fails here, as do the README's links into
docs/."""

from __future__ import annotations

import ast
import importlib
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.clirunner import REPO_ROOT


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``project``'s mkdocs.yml into ``site``."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "--config-file", str(project / "mkdocs.yml"), "--site-dir", str(site)],
        text=True, capture_output=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = build(REPO_ROOT, out)
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    return out


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of the docs and mkdocs.yml to break."""
    shutil.copytree(REPO_ROOT / "docs", tmp_path / "docs")
    shutil.copy(REPO_ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    return tmp_path


def test_the_site_builds_strict_with_every_page(site: Path) -> None:
    pages = sorted(p.stem for p in (REPO_ROOT / "docs").glob("*.md"))
    assert len(pages) >= 14  # the topics the README moved out, and the index
    for page in pages:
        built = site / ("index.html" if page == "index" else f"{page}/index.html")
        assert built.is_file(), page


def test_the_gates_own_readme_is_a_page_of_the_site(site: Path) -> None:
    # The gate's most detailed page lives beside its code; the site shows that very file.
    page = REPO_ROOT / "docs" / "gate-internals.md"
    assert page.resolve() == (REPO_ROOT / "host" / "src" / "xla_host" / "gate" / "README.md")
    built = (site / "gate-internals" / "index.html").read_text()
    assert "The ship gate" in built and "The recompilation canary" in built


def test_a_broken_link_fails_the_build(copy: Path) -> None:
    with (copy / "docs" / "settings.md").open("a") as page:
        page.write('\nSee ["Targets"](target.md).\n')
    result = build(copy, copy / "site")
    assert result.returncode != 0
    assert "settings.md' contains a link 'target.md'" in result.stderr, result.stderr


def test_a_link_to_a_missing_heading_fails_the_build(copy: Path) -> None:
    with (copy / "docs" / "settings.md").open("a") as page:
        page.write('\nSee ["Gate"](gate.md#no-such-heading).\n')
    result = build(copy, copy / "site")
    assert result.returncode != 0
    assert "no-such-heading" in result.stderr, result.stderr


def test_a_page_missing_from_the_nav_fails_the_build(copy: Path) -> None:
    (copy / "docs" / "orphan.md").write_text("# Orphan\n")
    result = build(copy, copy / "site")
    assert result.returncode != 0
    assert "orphan.md" in result.stderr, result.stderr


def test_the_readme_links_into_docs_reach_a_page_and_its_heading(site: Path) -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)\s]*)\)", readme)
    assert len(links) >= 14, links  # the "Where to read on" table at least
    for link in links:
        path, _, anchor = link.partition("#")
        page = Path(path).stem
        built = site / ("index.html" if page == "index" else f"{page}/index.html")
        assert built.is_file(), f"README links to {link}: no such page"
        if anchor:
            assert f'id="{anchor}"' in built.read_text(
                encoding="utf-8"
            ), f"README links to {link}: no heading with that anchor"


def test_the_readme_starts_with_the_two_commands() -> None:
    head = (REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:6]
    assert any(line.startswith("make wheels BUNDLE=v6e-2.11 ") for line in head), head
    assert any(line.startswith("make test ") for line in head), head


# --- docs kept true by the code -----------------------------------------------------------

#: Pages whose repository paths must name what exists (the gate's own README too).
PAGES = (*sorted((REPO_ROOT / "docs").glob("*.md")), REPO_ROOT / "README.md",
         REPO_ROOT / "host" / "src" / "xla_host" / "gate" / "README.md")  # fmt: skip
_PATH_PREFIXES = ("src/", "host/", "tests/", "patches/", "build/", "scripts/", "docs/", ".ci/")


def stale_paths(pages: tuple[Path, ...] | list[Path], root: Path) -> list[str]:
    """Each `path` in backticks under a repository folder that names nothing there
    (placeholders such as `<bundle>` and globs that match are fine)."""
    stale = []
    for page in pages:
        for match in re.finditer(r"`([^`\s]+)`", page.read_text()):
            path = match.group(1).rstrip(".,:;").split("::")[0]
            path = path.split(":")[0]  # a file's factory, a line number
            if not path.startswith(_PATH_PREFIXES) or any(c in path for c in "<>…{}$"):
                continue
            if any(c in path for c in "*?["):
                if not list(root.glob(path)):
                    stale.append(f"{page.name}: {path}")
            elif not (root / path).exists():
                stale.append(f"{page.name}: {path}")
    return stale


def test_every_repository_path_the_docs_name_exists() -> None:
    assert stale_paths(PAGES, REPO_ROOT) == []


def test_a_stale_path_planted_in_a_copy_of_the_docs_is_named(copy: Path) -> None:
    page = copy / "docs" / "gate.md"
    page.write_text(page.read_text() + "\nSee `host/src/xla_host/gate/restart_27.py`.\n")
    assert stale_paths([page], REPO_ROOT) == ["gate.md: host/src/xla_host/gate/restart_27.py"]


_MODULE = re.compile(r"\b(?:xla_wheels|xla_host)(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_ENV = re.compile(r"\bXLA_WHEELS_[A-Z0-9_]*[A-Z0-9]\b")
_MAKE = re.compile(r"^make ([a-z][a-z0-9-]*)")
_IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]*$")


def _resolves(dotted: str) -> bool:
    """A module of the project, or an attribute of one (``xla_host.gate.run.GateConfig``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def _make_targets(root: Path) -> set[str]:
    text = (root / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z0-9-]*)\s*:(?!=)", text, re.MULTILINE))


def _make_variables(root: Path) -> set[str]:
    """The variables a make command line may set: the table's (``MAKE_VARIABLES``) and
    the Makefile's own (``NAME ?= ...``, ``NAME := ...``)."""
    from xla_wheels.make_help import read_makefile

    text = (root / "Makefile").read_text()
    own = re.findall(r"^([A-Z][A-Z0-9_]*)\s*(?:\?=|:=|=)", text, re.MULTILINE)
    table = read_makefile(text + "\n" + (root / "src/xla_wheels/make-variables.mk").read_text())
    return set(table.table) | set(own)


def _names_the_code_uses(root: Path) -> str:
    """Every source, test and build file's text: a variable the docs name must be in it."""
    files = [*root.glob("src/**/*.py"), *root.glob("host/src/**/*.py"), *root.glob("tests/*.py"),
             root / "Makefile", *root.glob("scripts/*"), *root.glob(".ci/*")]  # fmt: skip
    # Not this file, which plants stale names in a copy of the docs.
    files = [p for p in files if p.is_file() and p.resolve() != Path(__file__).resolve()]
    return "\n".join(p.read_text(errors="replace") for p in files)


def _fixtures_and_markers(root: Path) -> set[str]:
    """The suite's fixtures (functions under ``pytest.fixture`` or ``once_per_run``) and
    its markers."""
    names = set()
    for path in root.glob("tests/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                "fixture" in ast.unparse(d) or "once_per_run" in ast.unparse(d)
                for d in node.decorator_list
            ):
                names.add(node.name)
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    markers = pyproject["tool"]["pytest"]["ini_options"]["markers"]
    return names | {marker.split(":")[0] for marker in markers}


def stale_names(pages: tuple[Path, ...] | list[Path], root: Path) -> list[str]:
    """Each name in backticks that resolves to nothing today: a module (``xla_host.x``,
    also after ``python -m``), a make target (```make x ...```) and the variables it sets,
    an ``XLA_WHEELS_*``
    variable no code reads, a fixture (a backticked name on a line about fixtures); a
    "Not done yet" section, which names what is planned, aside."""
    targets = _make_targets(root)
    make_variables = _make_variables(root)
    code = _names_the_code_uses(root)
    fixtures = _fixtures_and_markers(root)
    stale = []
    for page in pages:
        planned = False
        for line in page.read_text().splitlines():
            if line.startswith("#"):
                # A "Not done yet" section names what does not exist yet, on purpose.
                planned = "not done" in line.lower()
            if planned:
                continue
            for quoted in re.findall(r"`([^`]+)`", line):
                for module in _MODULE.findall(quoted):
                    if not _resolves(module.rstrip(".")):
                        stale.append(f"{page.name}: module {module}")
                if (target := _MAKE.match(quoted)) and target.group(1) not in targets:
                    stale.append(f"{page.name}: make target {target.group(1)}")
                if target:
                    # A quoted value (BUILD_ARGS='NAME=VALUE') sets nothing of make's.
                    unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "", quoted)
                    for variable in re.findall(r"(?<![\w-])([A-Z][A-Z0-9_]*)=", unquoted):
                        if variable not in make_variables:
                            stale.append(f"{page.name}: make variable {variable}")
                for variable in _ENV.findall(quoted):
                    if variable not in code:
                        stale.append(f"{page.name}: variable {variable}")
                if "fixture" in line and _IDENTIFIER.match(quoted) and quoted not in fixtures:
                    stale.append(f"{page.name}: fixture {quoted}")
    return stale


def test_every_module_make_target_variable_and_fixture_the_docs_name_exists() -> None:
    assert stale_names(PAGES, REPO_ROOT) == []


def test_a_stale_module_target_variable_or_fixture_planted_in_a_copy_is_named(
    copy: Path,
) -> None:
    page = copy / "host-gate-README.md"
    shutil.copy(REPO_ROOT / "host" / "src" / "xla_host" / "gate" / "README.md", page)
    assert stale_names([page], REPO_ROOT) == []
    page.write_text(
        page.read_text()
        + "\nRun `python -m xla_wheels.gate_runner`, or `xla_host.gate.run.GateConfigs`.\n"
        + "Then `make gate-all GATE_DEVICE=CPU` with `XLA_WHEELS_GATE_CHECKS=restart`.\n"
        + "Or `make gate CHECK=restart`.\n"
        + "The shared fixture `restart_27` runs it once.\n"
        + "\n## Not done yet\n\n`make cache-upload`, planned.\n"
    )
    assert stale_names([page], REPO_ROOT) == [
        "host-gate-README.md: module xla_wheels.gate_runner",
        "host-gate-README.md: module xla_host.gate.run.GateConfigs",
        "host-gate-README.md: make target gate-all",
        "host-gate-README.md: variable XLA_WHEELS_GATE_CHECKS",
        "host-gate-README.md: make variable CHECK",
        "host-gate-README.md: fixture restart_27",
    ]


def test_the_layout_in_the_development_page_is_written_from_the_code() -> None:
    from xla_wheels import layout_docs

    page = (REPO_ROOT / "docs" / "development.md").read_text()
    assert layout_docs.with_layout(page) == page, (
        "docs/development.md's layout differs from the code: run " "make generate"
    )
    every = [p.name for package, _ in layout_docs.PACKAGES
             for p in layout_docs.members(REPO_ROOT / package)]  # fmt: skip
    assert all(name in page for name in every)
