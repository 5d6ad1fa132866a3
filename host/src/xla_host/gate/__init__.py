"""The ship gate for torch_xla builds: warm-restart (persistent cache) and HBM-query checks.

Cache files on disk prove nothing; a build ships only if a warm restart is faster with zero
recompiles and the HBM query reaches the physical devices under SPMD. Every measurement
runs in fresh child processes of the environment under test (``child_workload.py``, which
imports only the standard library, torch and torch_xla) and reports JSON through a file.
The gate itself imports only the standard library and this package (its entry point is
``gate/run.py``, which ``cli/gate.py`` parses for and prints), so the builder image runs
it as the ship check without the pipeline's dependencies; ``tests/test_layers.py`` keeps
it so.
"""
