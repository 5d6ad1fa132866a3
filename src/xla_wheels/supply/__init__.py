"""Supply-chain evidence in the ecosystem's own formats.

``sbom``: a CycloneDX document inside each wheel (PEP 770), derived from the provenance.
``attest``: per wheel, an in-toto statement with an SLSA provenance predicate, signed as
a DSSE envelope with the team's key. ``rebuild``: rebuild a bundle's wheels into a fresh
stage and compare them with the recorded ones, with diffoscope's report on a difference.

These modules run on the host, in the pipeline's environment (their libraries are pinned
in requirements-dev.txt), never inside the builder image.
"""
