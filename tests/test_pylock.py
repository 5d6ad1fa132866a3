"""pylock.toml (PEP 751): written through packaging.pylock, read back by it."""

from __future__ import annotations

import tomllib

import pytest
from packaging.pylock import Pylock
from packaging.version import Version

from xla_wheels.publish.errors import PublishError
from xla_wheels.publish.index import IndexFile
from xla_wheels.release.pylock import LockedFile, render_pylock

LANE = "file:///srv/lanes/validation/simple/"
PUBLIC = "https://pypi.org/simple/"
OURS = "torch_xla-2.9.0+x.ab12-cp311-cp311-linux_x86_64.whl"
THEIRS = "libtpu-0.0.36-py3-none-manylinux_2_31_x86_64.whl"


def _files(sha: str = "a" * 64) -> tuple[list[LockedFile], dict[str, IndexFile]]:
    files = [
        LockedFile("torch-xla", "2.9.0+x.ab12", OURS, sha, LANE),
        LockedFile("libtpu", "0.0.36", THEIRS, "b" * 64, PUBLIC),
    ]
    urls = {
        OURS: IndexFile(OURS, f"file:///srv/lanes/validation/{OURS}#sha256={sha}", sha),
        THEIRS: IndexFile(THEIRS, f"https://files.example/{THEIRS}", "b" * 64),
    }
    return files, urls


def test_the_written_lock_reads_back_with_packaging_pylock() -> None:
    files, urls = _files()
    text = render_pylock(files, urls, "3.11", "# made by a test\n")
    assert text.startswith("# made by a test\n")
    lock = Pylock.from_dict(tomllib.loads(text))
    assert lock.created_by == "xla-wheels"
    assert lock.requires_python is not None and "3.11.4" in lock.requires_python
    assert "3.12.0" not in lock.requires_python
    packages = {str(p.name): p for p in lock.packages}
    assert sorted(packages) == ["libtpu", "torch-xla"]
    [wheel] = packages["torch-xla"].wheels or []
    assert packages["torch-xla"].version == Version("2.9.0+x.ab12")
    assert packages["torch-xla"].index == LANE
    # The index link's #sha256= fragment is not part of the URL; the hash is apart.
    assert wheel.url == f"file:///srv/lanes/validation/{OURS}"
    assert wheel.hashes == {"sha256": "a" * 64}
    [public] = packages["libtpu"].wheels or []
    assert (public.url, public.hashes) == (f"https://files.example/{THEIRS}", {"sha256": "b" * 64})


def test_a_lock_that_breaks_pep_751_is_not_written() -> None:
    # The raw dict written before took a wheel whose file name says another version.
    files, urls = _files()
    files[0] = LockedFile("torch-xla", "2.9.1", OURS, "a" * 64, LANE)
    with pytest.raises(PublishError, match="not consistent with package version") as caught:
        render_pylock(files, urls, "3.11", "")
    assert caught.value.message.startswith("pylock.toml would not be a valid PEP 751 lock")
