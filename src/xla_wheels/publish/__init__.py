"""Stage 6: from wheel to training host.

``publish`` uploads a bundle's locked wheels to a PEP 503 index (or writes a static one),
``requirements`` writes the hash-pinned requirements file hosts install from,
``verify-install`` proves that file installs into a fresh venv, and ``doctor`` checks a
training host against a bundle before anything imports torch_xla. Their arguments are
in ``cli/publish.py``.
"""
