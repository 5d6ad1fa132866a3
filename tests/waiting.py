"""How long a test waits for a process the product must end before it calls it hung.

A wait is not a measurement: a test that waits for a process to end polls until it has,
and gives up only at a bound so far beyond the product's own that no load reaches it.
"""

from __future__ import annotations

from xla_host.runner import STOP_GRACE_S

#: The product ends a child with SIGTERM, then SIGKILL after its grace (STOP_GRACE_S), so
#: a process it stops is gone long before ten times that, however busy the machine; one
#: still there then was never stopped. Only a process that outlives its stop (the failure
#: the tests look for) waits this long.
STOPPED_WITHIN_S = 10 * STOP_GRACE_S
