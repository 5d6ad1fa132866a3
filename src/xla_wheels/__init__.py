"""xla_wheels: build, publish and gate patched PyTorch/XLA wheels from pinned bundles.

Data flows one way through the stages:
bundle -> sources -> patches -> build -> collect/lock -> publish -> gate.
Each stage is a module with typed inputs and outputs. The ``cli`` package holds every
subcommand's arguments and is the only place that turns errors into messages and exit
codes; ``options`` is the one reader of settings (flags, then ``XLA_WHEELS_*``, then
defaults), with the environment passed in.
"""

__version__ = "0.1.0"
