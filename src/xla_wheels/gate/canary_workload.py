"""The recompilation canary's training loop, run by file path inside the environment under test.

Like ``child_workload.py`` this runs with the judged interpreter, which does not have the
``xla_wheels`` package: standard library, torch and torch_xla only; the parent sets the
runtime policy in the environment before ``import torch_xla``; the result goes to the
JSON file named by ``--out``.

One variant per process (``--variant``):

  steady         AdamW (``capturable=True``) with its learning rate a device tensor that a
                 schedule updates on the device; fixed shapes; nothing read back to Python
  item-readback  the same step, plus ``loss.item()`` every step (a device-to-host transfer)
  shape-drift    the same step on a batch one row larger every step (a new graph each step)

The child records torch_xla's counters and metric sample counts (``torch_xla.debug.metrics``)
after the model is set up, after the warm-up steps and after the measured steps; the
parent's verdict (``gate.canary``) judges what moved between the last two. It reports
everything the metrics module knows, not a chosen few, so a counter that moves on another
build is in the evidence too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Any

VARIANTS = ("steady", "item-readback", "shape-drift")
#: Small enough that a CPU compile takes well under a second; shapes fixed per variant.
WIDTH = 128
BATCH = 32


def _write(path: str, payload: dict[str, Any]) -> None:
    tmp = path + ".part"
    with open(tmp, "w") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True)
    os.replace(tmp, path)


def _snapshot() -> dict[str, dict[str, int]]:
    """Every counter's value and every metric's sample count, by name."""
    import torch_xla.debug.metrics as met

    counters = {name: int(met.counter_value(name) or 0) for name in met.counter_names()}
    metrics: dict[str, int] = {}
    for name in met.metric_names():
        data = met.metric_data(name)
        metrics[name] = int(data[0]) if data else 0
    return {"counters": counters, "metrics": metrics}


def run(variant: str, warmup: int, steps: int) -> dict[str, Any]:
    import torch
    import torch_xla

    device = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1)
    ).to(device)
    # The per-step scalars live on the device: a tensor learning rate, and capturable=True
    # keeps AdamW's step count on the device too, so its bias corrections are computed
    # there. With capturable=False the step count stays on the CPU and the bias
    # corrections become new Python floats every step (one host-to-device transfer each).
    # foreach=False is what torch picks for XLA parameters anyway (torch.optim.optimizer.
    # _default_to_fused_or_foreach enables foreach only on its native device types); it is
    # explicit so a torch upgrade cannot change which update path is measured.
    learning_rate = torch.tensor(1e-3, device=device)
    decay = torch.tensor(0.99, device=device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=learning_rate, weight_decay=0.01, capturable=True, foreach=False
    )
    inputs = torch.randn(BATCH, WIDTH).to(device)
    targets = torch.randn(BATCH, 1).to(device)
    readbacks: list[float] = []

    def step(index: int) -> None:
        batch_inputs, batch_targets = inputs, targets
        if variant == "shape-drift":
            rows = BATCH + index
            batch_inputs = torch.randn(rows, WIDTH).to(device)
            batch_targets = torch.randn(rows, 1).to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(batch_inputs), batch_targets)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            # The schedule runs on the device: no new Python scalar enters the graph.
            learning_rate.mul_(decay)
        torch_xla.sync()
        if variant == "item-readback":
            readbacks.append(float(loss.item()))

    set_up = _snapshot()
    for index in range(warmup):
        step(index)
    after_warmup = _snapshot()
    for index in range(warmup, warmup + steps):
        step(index)
    after_steps = _snapshot()
    # Read only after the last snapshot: the final value must not count as a step's transfer.
    final_learning_rate = float(learning_rate.cpu())
    return {
        "variant": variant,
        "warmup_steps": warmup,
        "steps": steps,
        "torch_version": torch.__version__,
        "torch_xla_version": getattr(torch_xla, "__version__", "unknown"),
        "lr_is_tensor": isinstance(optimizer.param_groups[0]["lr"], torch.Tensor),
        "final_learning_rate": final_learning_rate,
        "readbacks": len(readbacks),
        "snapshots": {"set_up": set_up, "after_warmup": after_warmup, "after_steps": after_steps},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="JSON report path")
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    payload: dict[str, Any] = {"mode": "canary", "pid": os.getpid(), "python": sys.executable}
    try:
        payload.update(run(args.variant, args.warmup, args.steps))
        payload["ok"] = True
        code = 0
    except BaseException as error:  # reported to the parent as data, not a traceback dump
        payload.update(
            {
                "ok": False,
                "error": f"{type(error).__name__}: {error}",
                "traceback": traceback.format_exc(),
            }
        )
        code = 3
    _write(args.out, payload)
    return code


if __name__ == "__main__":
    sys.exit(main())
