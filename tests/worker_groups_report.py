"""A pytest plugin for tests/test_worker_groups.py: prints each collected test's xdist
group (``GROUP <group> <test id>``), as tests/conftest.py assigned it."""

from __future__ import annotations

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        group = (mark.args[0] if mark.args else mark.kwargs["name"]) if mark else "-"
        print(f"GROUP {group} {item.nodeid}")
