"""The host side of xla-wheels: what a training host runs (the restart gate, doctor, the
launch environment, receipts), installed from a lane as a wheel of its own.

Standard library only: a TPU host's torch environment must not gain packages that could
change what is judged. The builder side (``xla_wheels``) imports this package, never the
other way round (the ``host-alone`` import-linter contract in pyproject.toml).
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("xla-wheels-host")
except _metadata.PackageNotFoundError:  # run from the sources (the builder's ship check)
    __version__ = "0+sources"
