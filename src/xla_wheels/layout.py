"""Where a bundle's work and products live: one object, built from the options.

::

    <out>/<bundle>/src/<component>        worktrees (sources stage), patched in place
    <out>/<bundle>/logs/<recipe>.log      one log per recipe and the ship check
    <out>/<bundle>/buildenv               the build's Python environment
    <out>/<bundle>/build-spec.json        the spec the builder entry point reads
    <out>/<bundle>/ship-env, ship-check   the ship check's environment and output
    <out>/<bundle>/verify-install         verify-install's venv, requirements and report
    <dist>/<bundle>                       the collected wheels (renamed into place)
    <dist>/.staging-<bundle>-XXXXXXXX     wheels under the ship check
    <dist>/.old-<bundle>-XXXXXXXX         the previous wheels while the new ones move in
    <root>/wheels.lock                    what each bundle was built from and produced

``<out>`` is ``--out-dir`` (default ``<root>/out``), ``<dist>`` is ``<root>/dist`` or
``--dist-dir``. Nothing else in the package derives these paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xla_wheels.options import PipelineOptions


@dataclass(frozen=True)
class BundleLayout:
    bundle: str
    out_dir: Path
    dist_root: Path
    lock_path: Path

    @classmethod
    def of(
        cls, options: PipelineOptions, bundle: str, *, dist_root: Path | None = None
    ) -> BundleLayout:
        return cls(
            bundle=bundle,
            out_dir=options.out_dir,
            dist_root=dist_root or options.root / "dist",
            lock_path=options.lock_path,
        )

    @property
    def work(self) -> Path:
        return self.out_dir / self.bundle

    @property
    def src(self) -> Path:
        return self.work / "src"

    def worktree(self, component: str) -> Path:
        return self.src / component

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    @property
    def buildenv(self) -> Path:
        return self.work / "buildenv"

    @property
    def spec_path(self) -> Path:
        return self.work / "build-spec.json"

    @property
    def ship_env(self) -> Path:
        return self.work / "ship-env"

    @property
    def ship_check(self) -> Path:
        return self.work / "ship-check"

    @property
    def verify_install(self) -> Path:
        return self.work / "verify-install"

    @property
    def dist(self) -> Path:
        return self.dist_root / self.bundle

    @property
    def staging_prefix(self) -> str:
        """Name prefix of a staging directory under :attr:`dist_root`."""
        return f".staging-{self.bundle}-"

    @property
    def old_prefix(self) -> str:
        return f".old-{self.bundle}-"
