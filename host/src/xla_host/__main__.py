"""``python -m xla_host``: the host's own command line (never the builder's)."""

import sys

from xla_host.cli import host_main

sys.exit(host_main())
