"""``python -m xla_wheels`` is the same CLI as ``xla-wheels``."""

import sys

from xla_wheels.cli import main

sys.exit(main())
