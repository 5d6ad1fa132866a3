"""Each test's CPU time, its own and its waited-for children's (conftest loads this plugin).

The suite is bound by CPU on the 2-core machines it runs on, so a test's cost is the CPU it
takes (pytest's worker and every process it waited for), not its wall time, which a busy
machine stretches. With ``SUITE_CPU_FILE=<file>`` each test appends one JSON line
(``nodeid``, ``cpu_s``, ``wall_s``) to the file; ``python -m tests.cpu_cost <file>`` prints
the costliest tests and modules. A process a test kills without waiting for it (a server's
process group) is not counted.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path

import pytest

ENV = "SUITE_CPU_FILE"


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    target = os.environ.get(ENV)
    if not target:
        yield
        return
    cpu, wall = _cpu_s(), time.monotonic()
    yield  # setup (a module's shared fixture counts for its first test), call, teardown
    line = {"nodeid": item.nodeid, "cpu_s": round(_cpu_s() - cpu, 3),
            "wall_s": round(time.monotonic() - wall, 3)}  # fmt: skip
    with open(target, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def report(path: Path, top: int = 40) -> str:
    """The costliest tests and modules of a run's file, by CPU."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for row in rows:
        module = modules[row["nodeid"].split("::")[0]]
        module[0] += row["cpu_s"]
        module[1] += row["wall_s"]
    total_cpu = sum(row["cpu_s"] for row in rows)
    lines = [f"{len(rows)} tests, {total_cpu:.0f} CPU-s in all", "", "modules by CPU-s (wall-s):"]
    for name, (cpu, wall) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {cpu:8.1f} ({wall:7.1f})  {name}")
    lines += ["", "tests by CPU-s (wall-s):"]
    for row in sorted(rows, key=lambda r: -r["cpu_s"])[:top]:
        lines.append(f"  {row['cpu_s']:8.1f} ({row['wall_s']:7.1f})  {row['nodeid']}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]), *(int(a) for a in sys.argv[2:3])))
