"""The documentation: README.md is the five-minute start, docs/ the rest by topic, built as
a site by MkDocs (mkdocs.yml). The build is strict, so a broken link, an anchor that no
heading has, or a page left out of the nav fails here, as do the README's links into
docs/."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
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


def test_the_layout_in_the_development_page_is_written_from_the_code() -> None:
    from xla_wheels import layout_docs

    page = (REPO_ROOT / "docs" / "development.md").read_text()
    assert layout_docs.with_layout(page) == page, (
        "docs/development.md's layout differs from the code: run "
        ".venv/bin/python -m xla_wheels.layout_docs --write"
    )
    every = [p.name for package, _ in layout_docs.PACKAGES
             for p in layout_docs.members(REPO_ROOT / package)]  # fmt: skip
    assert all(name in page for name in every)
