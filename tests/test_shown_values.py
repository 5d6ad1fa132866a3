"""What the pipeline shows (errors, fixes, log lines, plans, listings) cannot act on the
terminal: control characters from a manifest or the user are shown escaped (``\\x1b``),
by one helper (``xla_host.redact.printable``), where credentials are masked too."""

from __future__ import annotations

from pathlib import Path

from tests.gitrepos import make_project
from xla_host.errors import PipelineError
from xla_host.redact import printable

# Clear the screen, retitle the window, ring the bell, a C1 control sequence introducer.
ESCAPES_TOML = r"\u001b[2J\u001b]0;owned\u0007\u009b31m"
ESCAPES_SHOWN = r"\x1b[2J\x1b]0;owned\x07\x9b31m"


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]


def test_control_characters_are_escaped_and_text_kept() -> None:
    assert printable("a\x1b[31mb\x07\x9b") == r"a\x1b[31mb\x07\x9b"
    assert printable("line\n\tindented é ✓") == "line\n\tindented é ✓"


def test_an_error_shows_a_value_escaped() -> None:
    error = PipelineError("bad value '\x1b[2J'", fix="not '\x1b]0;t\x07'")
    assert error.message == r"bad value '\x1b[2J'" and error.fix == r"not '\x1b]0;t\x07'"


def _manifest(project: Path) -> Path:
    return project / "build" / "bundles" / "test-1.toml"


def test_a_manifest_description_is_listed_escaped(tmp_path: Path, upstreams, run_cli) -> None:
    project = make_project(tmp_path, upstreams)
    manifest = _manifest(project)
    manifest.write_text(
        manifest.read_text().replace('description = "test"', f'description = "{ESCAPES_TOML}"')
    )
    result = run_cli("bundles", root=project)
    assert result.exit_code == 0, result.output
    assert f"test-1: {ESCAPES_SHOWN}" in result.stdout
    assert _raw_controls(result.output) == []


def test_a_bad_manifest_value_is_named_escaped(tmp_path: Path, upstreams, run_cli) -> None:
    project = make_project(tmp_path, upstreams)
    manifest = _manifest(project)
    manifest.write_text(manifest.read_text().replace('python = "3.11"', 'python = "3.x\\u001b[2J"'))
    result = run_cli("bundles", root=project)
    assert result.exit_code == 2, result.output
    assert r"'3.x\x1b[2J' is not a Python 3 minor version" in result.stderr
    assert _raw_controls(result.output) == []
