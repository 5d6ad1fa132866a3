"""The embedded default index: a static PEP 503 tree written next to the wheels.

``dist/<bundle>/simple/`` holds ``index.html`` (the project list) and
``<normalized-project>/index.html`` whose links point at ``../../<wheel>#sha256=<hex>``,
so the wheels are not copied and the tree works both as ``pip --index-url
file://.../dist/<bundle>/simple/`` and behind any static web server serving
``dist/<bundle>/``. pip checks the ``#sha256=`` fragment of every file it downloads.
"""

from __future__ import annotations

import html
import shutil
import tempfile
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from xla_host import filemode
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.wheels_lock import WheelRecord

INDEX_DIRNAME = "simple"


def _page(title: str, links: Sequence[tuple[str, str]]) -> str:
    body = "\n".join(
        f'    <a href="{html.escape(href, quote=True)}">{html.escape(text)}</a><br/>'
        for href, text in links
    )
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        '    <meta name="pypi:repository-version" content="1.0">\n'
        f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n"
        f"    <h1>{html.escape(title)}</h1>\n{body}\n  </body>\n</html>\n"
    )


def write_static_index(directory: Path, wheels: Sequence[WheelRecord]) -> Path:
    """(Re)write ``directory/simple/`` for ``wheels`` (which live in ``directory``)."""
    projects: dict[str, list[WheelRecord]] = {}
    for wheel in wheels:
        projects.setdefault(parse_wheel_name(wheel.name).normalized, []).append(wheel)
    target = directory / INDEX_DIRNAME
    # Built aside and swapped in, so a reader never sees a half-written index.
    staging = Path(tempfile.mkdtemp(prefix=".simple.", dir=directory))
    try:
        root_links = [(f"{name}/", name) for name in sorted(projects)]
        (staging / "index.html").write_text(_page("Simple index", root_links))
        for name, members in sorted(projects.items()):
            links = [
                (f"../../{urllib.parse.quote(w.name)}#sha256={w.sha256}", w.name)
                for w in sorted(members, key=lambda w: w.name)
            ]
            (staging / name).mkdir()
            (staging / name / "index.html").write_text(_page(f"Links for {name}", links))
        filemode.as_if_created(staging)  # mkdtemp made it 0700
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
