"""The gate's built-in workloads, written against the same protocol as a user's own.

``--workload small`` (``medium``, ``large``) is ``--workload <this file>:small``: the
child (``child_workload.py``) loads this file by path exactly as it loads a user's file,
calls the factory and runs what it returns, so a preset and a user's workload share one
code path. The protocol is :mod:`xla_host.gate.workload`'s docstring (and docs/gate.md
"Your own workload").

This file runs inside the environment under test like the child: the standard library,
torch and torch_xla only, and those imported inside the factories, so the gate's parent
reads :data:`PRESETS` without torch.
"""

from __future__ import annotations

from typing import Any

#: Fixed shapes per preset: the cache key depends on them, so they never vary by run.
PRESETS: dict[str, dict[str, int]] = {
    "small": {"layers": 8, "width": 512, "batch": 64, "steps": 3},
    # Many narrow layers: a graph whose XLA compile takes seconds on CPU while each step
    # stays cheap, so a restart's figures are dominated by what a cache can save.
    "medium": {"layers": 64, "width": 256, "batch": 32, "steps": 3},
    # Large enough that compilation dominates a TPU restart; too slow for CPU CI.
    "large": {"layers": 32, "width": 4096, "batch": 512, "steps": 4},
}


def _mlp(name: str, device: Any, mesh: Any) -> dict[str, Any]:
    """A stack of Linear+ReLU layers trained with SGD on a fixed random batch."""
    import torch

    shape = PRESETS[name]
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(shape["layers"]):
        layers += [torch.nn.Linear(shape["width"], shape["width"]), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(shape["batch"], shape["width"]).to(device)
    targets = torch.randn(shape["batch"], shape["width"]).to(device)
    if mesh is not None:
        import torch_xla.distributed.spmd as xs

        # The batch sharded over every device: each step's gradients need all-reduces.
        xs.mark_sharding(inputs, mesh, ("data", None))
        xs.mark_sharding(targets, mesh, ("data", None))

    def step(batch: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(batch), wanted)
        loss.backward()
        optimizer.step()
        return loss

    return {
        "model": model,
        "inputs": (inputs, targets),
        "step": step,
        "steps": shape["steps"],
        "params": dict(shape),
    }


def small(device: Any, mesh: Any = None) -> dict[str, Any]:
    return _mlp("small", device, mesh)


def medium(device: Any, mesh: Any = None) -> dict[str, Any]:
    return _mlp("medium", device, mesh)


def large(device: Any, mesh: Any = None) -> dict[str, Any]:
    return _mlp("large", device, mesh)
