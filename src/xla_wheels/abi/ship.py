"""The ABI check inside the build's ship check: the staged torch_xla against the staged torch.

Runs on the build host, on the wheel files in staging, before the gate's check installs
them: a pair whose ``_XLAC`` imports a symbol its torch lacks fails here with the names,
rather than as ``undefined symbol`` at import inside the check's environment. A
torch_xla wheel without ``_XLAC`` (the synthetic upstream of the tests) makes the check
"not applicable", said as such, never reported as a pass.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xla_host import log
from xla_wheels.abi.pairs import (
    AbiResult,
    NoExtension,
    check_pair,
    ensure_compatible,
    from_wheels,
    pick_pair,
    render,
)


@dataclass(frozen=True)
class ShipAbiOutcome:
    result: AbiResult | None
    """None when the check did not apply."""
    note: str


def check_staged(wheels: Sequence[Path], where: str) -> ShipAbiOutcome:
    """Check the staged pair; raises ``AbiMismatch`` naming the missing symbols."""
    torch, torch_xla = pick_pair(list(wheels), where)
    with tempfile.TemporaryDirectory(prefix="xla-wheels-abi-") as work:
        try:
            files = from_wheels(torch, torch_xla, Path(work))
        except NoExtension as error:
            log.info(f"abi check: {error.message}")
            return ShipAbiOutcome(None, error.message)
        result = check_pair(files)
    log.info(render(result))
    ensure_compatible(result)
    return ShipAbiOutcome(result, "ok")
