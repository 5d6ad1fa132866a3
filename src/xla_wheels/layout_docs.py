"""The package layout in docs/development.md, written from the code.

Each module's and subpackage's summary (its docstring's first paragraph), in the order
import-linter's layers list them.

``make generate`` renders it between the page's
markers; ``tests/test_docs.py`` fails while the page differs, naming the module, so a
moved, added or renamed module shows in the docs without anyone remembering to.
"""

from __future__ import annotations

import ast
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "development.md"
#: The packages the page lays out, and the import-linter contract that orders each.
PACKAGES = (
    ("src/xla_wheels", "layers"),
    ("host/src/xla_host", "host-layers"),
)
_NAME_WIDTH = 24
_WIDTH = 90


def _begin(package: str) -> str:
    return f"<!-- layout: {package} (make generate) -->"


_END = "<!-- layout: end -->"


def summary(path: Path) -> str:
    """The first paragraph of a module's (a package's ``__init__``'s) docstring, or its
    first sentence when the paragraph is long."""
    source = path / "__init__.py" if path.is_dir() else path
    docstring = ast.get_docstring(ast.parse(source.read_text())) or ""
    paragraph = " ".join(docstring.split("\n\n")[0].split()).replace("``", "")
    if len(paragraph) > 160 and ". " in paragraph:
        paragraph = paragraph.split(". ")[0] + "."
    return paragraph or "(no docstring)"


def members(package_dir: Path) -> list[Path]:
    """The package's modules and subpackages, as the layout names them."""
    found = []
    for path in sorted(package_dir.iterdir()):
        if path.name.startswith(("_", ".")):
            continue
        if (path.is_dir() and (path / "__init__.py").is_file()) or path.suffix == ".py":
            found.append(path)
    return found


def layer_order(root: Path, contract: str) -> list[str]:
    """Module names in the order of the contract's layers (top first)."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c.get("id") == contract)
    order: list[str] = []
    for layer in layers:
        for alternative in layer.replace("(", "").replace(")", "").split("|"):
            for name in alternative.split(":"):
                name = name.strip().rsplit(".", 1)[-1]
                if name and name not in order:
                    order.append(name)
    return order


def render(root: Path, package: str, contract: str) -> str:
    package_dir = root / package
    order = layer_order(root, contract)
    found = members(package_dir)

    def rank(path: Path) -> tuple[int, str]:
        name = path.stem
        return (order.index(name) if name in order else len(order), name)

    lines = ["```"]
    for path in sorted(found, key=rank):
        name = path.name + ("/" if path.is_dir() else "")
        wrapped = textwrap.wrap(summary(path), _WIDTH - _NAME_WIDTH) or [""]
        lines.append(f"{name:<{_NAME_WIDTH}}{wrapped[0]}".rstrip())
        lines += [" " * _NAME_WIDTH + rest for rest in wrapped[1:]]
    lines.append("```")
    return "\n".join(lines) + "\n"


def with_layout(page: str, root: Path = ROOT) -> str:
    """``page`` with every package's block rendered anew between its markers."""
    for package, contract in PACKAGES:
        begin = _begin(package)
        head, found, rest = page.partition(begin)
        _, ended, tail = rest.partition(_END)
        if not found or not ended:
            raise ValueError(f"{PAGE.name} has no {begin} ... {_END} block")
        page = head + begin + "\n" + render(root, package, contract) + _END + tail
    return page


def outputs(root: Path) -> dict[Path, str]:
    """The page this module writes (``make generate``)."""
    page = root / "docs" / "development.md"
    return {page: with_layout(page.read_text(encoding="utf-8"), root)}
