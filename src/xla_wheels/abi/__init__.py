"""ABI check of a torch / torch_xla pair, without importing either.

The most reported install failure of torch_xla is ``ImportError: ... _XLAC...so:
undefined symbol: ...``: a torch_xla built against one torch, installed next to another.
The dynamic linker fails because ``_XLAC`` imports a symbol that the paired torch's
libraries do not export. This package finds every such symbol from the ELF files alone:

- ``elf``: the reader (pyelftools): a shared object's DT_NEEDED, imports and exports,
  with symbol versions, binding and visibility.
- ``compare``: the pure comparison: which imports of the extension the torch libraries it
  needs do not export, and how they group.
- ``pairs``: where a pair comes from (an installed environment, two wheel files, a
  bundle's locked wheels) and the check of one pair, its names demangled for people
  (binutils' ``c++filt``; without it they stay mangled and the report says so).
- ``stock``: stock wheels' shared libraries from PyPI, extracted once per machine.
- ``ship``: the check inside the build's ship check; ``xla_wheels.cli.abi``: ``abi-check``.
"""
