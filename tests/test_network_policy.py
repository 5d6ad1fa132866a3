"""The network policy is a value handed to each step, not a setting of the process.

Two reads of one silent index (a real loopback server that accepts and never answers),
one after the other in one process, each under its own policy: each ends after its own
timeout (the one it reports) and number of attempts (the connections the server counts),
whatever ran before it.
"""

from __future__ import annotations

import pytest

from tests.network_faults_support import silent_server
from xla_host.net import NetworkPolicy, NetworkTimedOut
from xla_wheels.publish.index import Credentials, check_reachable

NO_CREDENTIALS = Credentials(None, None, "none")


@pytest.mark.slow
def test_each_step_keeps_the_policy_it_was_given() -> None:
    with silent_server() as silent:
        connections = []
        for policy, attempts_text in (
            (NetworkPolicy(timeout_s=1, retries=1, backoff_s=0.1, heartbeat_s=0), "2 attempts"),
            (NetworkPolicy(timeout_s=2, retries=0, heartbeat_s=0), "1 attempt"),
        ):
            before = silent.connections()
            with pytest.raises(NetworkTimedOut) as caught:
                check_reachable(f"{silent.base}/simple/", NO_CREDENTIALS, network=policy)
            # The wait that ran out is this policy's own, not the default 60 s or the
            # step before's: the error names the limit each attempt was given.
            assert f"within {policy.timeout_s:.0f}s ({attempts_text})" in caught.value.message
            connections.append(silent.connections() - before)
        assert connections == [2, 1]  # each policy's attempts, one connection each
