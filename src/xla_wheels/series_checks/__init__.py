"""Compiled checks of the torch_xla patch series, run against a real pytorch/xla tree.

The check programs live next to the series (``patches/torch_xla/checks/``). Each one is
built with g++ from files of a pytorch/xla tree (compiled as they are, or functions and
member declarations taken verbatim into generated ``.inc`` files) against the real torch
2.9.0 headers and libraries, absl and googletest from Debian's packages, and stand-in
declarations for the OpenXLA types the extracted code calls. None of this is a torch_xla
build: it proves what the changed functions do, not that the whole tree compiles.

- :mod:`.toolchain`: the compiler, torch, absl and googletest, fetched into the per-machine
  cache (:func:`ensure_toolchain`), and ccache when it is on PATH;
- :mod:`.programs`: the check programs as data (:data:`ALL`);
- :mod:`.run`: build and run them on a tree (:func:`run_series_checks`), with g++'s errors
  parsed so that what no longer compiles is named.
"""
