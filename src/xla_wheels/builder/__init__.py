"""Stage 4, build, and stage 5, collect: torch and torch_xla wheels from patched sources.

Modules, in the order a run uses them:

- ``config``: the one ``BuildConfig`` (engine, mode, image, jobs, caches, ship check) and
  its defaults; ``cli.settings.build_config`` reads it from the flags and the environment.
- ``preflight``: every blocker at once, in seconds, before anything is fetched or built.
- ``spec``: the ``BuildSpec`` handed to the in-container entry point (JSON, paths identical
  inside and outside the container) and the stage-cache keys.
- ``recipes``: the exact commands of the torch and torch_xla builds and of the ship check,
  composed from the spec; the DRY_RUN plan prints the same list.
- ``run_recipe``: ``python -m xla_wheels.builder.run_recipe``, the entry point that runs a recipe,
  the same code on the host (BUILD_MODE=host) and inside the builder image. It imports
  only the standard library and this package, so the image needs no pipeline dependencies.
- ``container``: docker / podman / buildah / host behind one context manager.
- the local version label and the provenance file inside the torch_xla wheel are written
  by ``xla_wheels.wheel_stamp``, a low module: the SBOM and the checks read those files too.
- ``collect``: staging, ship check, atomic move into ``dist/<bundle>``, ``wheels.lock``.
- ``build_and_collect``: the orchestration that ``pipeline.run_until`` and ``pipeline.plan`` call.
"""
