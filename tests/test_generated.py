"""Every file written from the code is current: ``make generate`` (tools/generate.py) is the
one command that writes them, and each of its generators is checked here, so a row, a
target, an exit code or a module changed without regenerating is caught, naming the file."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tools import generate

from tests.gitrepos import REPO_ROOT


@pytest.mark.parametrize("name", list(generate.GENERATORS))
def test_each_generated_file_is_what_its_generator_says_today(name: str) -> None:
    stale = [
        str(path.relative_to(REPO_ROOT))
        for path, text in generate.GENERATORS[name](REPO_ROOT).items()
        if not path.is_file() or path.read_text(encoding="utf-8") != text
    ]
    assert stale == [], f"stale ({name}): {stale}; fix: make generate"


def test_make_generate_check_writes_nothing_and_passes_on_a_current_checkout() -> None:
    before = {p: p.read_bytes() for g in generate.GENERATORS.values() for p in g(REPO_ROOT)}
    checked = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "generate.py"), "--check"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert {p: p.read_bytes() for p in before} == before
