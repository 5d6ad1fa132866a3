"""Native stacks of a hung child, taken with gdb before the gate kills it.

A hang inside XLA (a collective rendezvous waiting forever, a lock held by a thread
blocked in C++) is invisible to Python-level tools: py-spy lists Python threads only.
``gdb -p PID -batch -ex 'thread apply all bt'`` shows every thread's native frames, so a
hung child's report says where it was stuck. Capturing is I/O (``capture_native_stacks``);
reading the text (``summarize_stacks``) is a pure function, tested on its own.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from xla_host import runner

#: gdb loads the symbols of torch's and torch_xla's large libraries first: about 35 s
#: measured on a busy 2-core machine.
GDB_TIMEOUT_S = 180.0

#: Function names that say what a stuck XLA process waits for.
_TELLING = re.compile(
    r"Rendezvous|AwaitAndLogIfStuck|Communicator::|Thunk::Execute|DeviceLocker::|Barrier"
)
#: ``#3  0x... in xla::cpu::AllReduceThunk::Execute(...) ()``: the function's name.
_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?([\w:~<>]+)\s*\(", re.MULTILINE)
_THREAD = re.compile(r"^Thread \d+ ", re.MULTILINE)


@dataclass(frozen=True)
class StackCapture:
    """What capturing the stacks gave: the file, or why there is none."""

    path: Path | None
    error: str | None = None


def capture_native_stacks(pid: int, path: Path, timeout_s: float = GDB_TIMEOUT_S) -> StackCapture:
    """Write every thread's native backtrace of ``pid`` to ``path`` (the process keeps running)."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return StackCapture(None, "gdb is not installed: no native stacks (apt-get install gdb)")
    argv = [gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt"]
    try:
        completed = runner.run(argv, timeout=timeout_s, check=False)
    except runner.StepTimedOut:
        return StackCapture(None, f"gdb did not finish within {timeout_s:.0f}s")
    except OSError as error:
        return StackCapture(None, f"gdb could not run: {error}")
    path.write_text(completed.stdout + completed.stderr)
    if not _THREAD.search(completed.stdout):
        # Typically ptrace refused (kernel.yama.ptrace_scope, a container without
        # CAP_SYS_PTRACE): the file keeps gdb's own explanation.
        return StackCapture(path, f"gdb attached no threads (exit {completed.returncode})")
    return StackCapture(path)


def summarize_stacks(text: str, limit: int = 4) -> dict[str, object]:
    """How many threads, and the telling frames most threads sit in (most common first)."""
    threads = len(_THREAD.findall(text))
    frames: Counter[str] = Counter()
    for block in _THREAD.split(text)[1:]:
        # Innermost first; one count per thread and name, so a deep recursion does not
        # dominate. The last two name components: ``InProcessCommunicator::AllReduce``.
        names = ["::".join(name.split("::")[-2:]) for name in _FRAME.findall(block)]
        telling = [name for name in names if _TELLING.search(name)]
        frames.update(list(dict.fromkeys(telling)))
    common = frames.most_common(limit)
    return {"threads": threads, "telling_frames": [f"{name} ({n} threads)" for name, n in common]}
