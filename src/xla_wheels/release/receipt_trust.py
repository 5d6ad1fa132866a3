"""Whether a receipt is signed with a key a lane accepts (``require-signed-receipts``).

A signed receipt is a DSSE envelope (``xla_host.receipt_signing``, made with openssl on the
host); it is verified here with securesystemslib, the library the attestations use, with
the lane's public keys (``receipt-keys``). The verdict per receipt is a sentence or None,
which the pure policy (``release.policy``) turns into the ``signature`` rule.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from xla_host.receipt_signing import PAYLOAD_TYPE
from xla_host.receipts import StoredReceipt


def signature_problems(receipts: Sequence[StoredReceipt], keys: Sequence[Path]) -> list[str | None]:
    """Per receipt: None when one of ``keys`` verifies its envelope, else why not."""
    if not keys:
        return [None] * len(receipts)
    # Lazy: the crypto libraries only when a lane requires signed receipts.
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    from xla_wheels import attestation

    loaded = [attestation.load_public_key(key) for key in keys]
    names = ", ".join(key.name for key in keys)
    problems: list[str | None] = []
    for stored in receipts:
        name = stored.path.name
        data = stored.envelope
        if data is None:
            problems.append(
                f"{name} is unsigned; the lane requires receipts signed with one of: {names}"
            )
            continue
        try:
            envelope = Envelope.from_dict(json.loads(json.dumps(data)))
            if envelope.payload_type != PAYLOAD_TYPE:
                problems.append(f"{name} is signed as {envelope.payload_type}, not a receipt")
                continue
            envelope.verify(loaded, 1)
        except (ValueError, KeyError, TypeError) as error:
            problems.append(f"{name} is not a well-formed DSSE envelope ({error})")
            continue
        except VerificationError:
            problems.append(
                f"{name}: its signature does not verify with any of {names} (signed with "
                "another key, or changed after it was signed)"
            )
            continue
        problems.append(None)
    return problems
