"""``python -m xla_host``: the same command line as ``xla-host`` (never the builder's)."""

import sys

from xla_host.cli import main

sys.exit(main())
