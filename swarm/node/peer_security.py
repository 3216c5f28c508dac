"""What a node says about its peers' security: a line at start, and the `security` entry of /health and
/v1/topology (the dashboard shows an open swarm in its header). Never anything derived from the secret.

Without a secret a swarm is open: any machine on the network can join it, and so
read every prompt and answer and change them. That must be impossible to miss,
so it is a WARNING at start and `"peers": "open"` wherever the node describes
itself; with a secret, peers must prove it and every peer link is encrypted.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .secrets import Secret, readable_by_others
from ..transport import sodium_gcm

log = logging.getLogger("swarm.security")

SHORT_SECRET_CHARS = 16


def describe(secret: Secret) -> dict:
    """The `security` entry of /health and /v1/topology (peers' half)."""
    if not secret:
        return {"peers": "open"}
    return {"peers": "secret", "secret_from": secret.source}


def log_at_start(secret: Secret) -> None:
    if not secret:
        log.warning("OPEN SWARM: this node has no swarm secret, so any machine on this network can join the "
                    "swarm, read every prompt and answer, and change them. Make one with `swarm-node "
                    "--new-secret` and give it to every node (README.md, Security)")
        return
    log.info("swarm secret from %s: peers must prove it, and every peer link is encrypted (AES-256-GCM; a "
             "hop's frames by %s)", secret.source,
             "libsodium" if sodium_gcm.IN_USE else "cryptography: libsodium's AES-GCM is not available here "
             "(no PyNaCl, no AES instructions, or SWARM_SODIUM=off), ~0.03 ms more per hop")
    if len(secret.value) < SHORT_SECRET_CHARS:
        log.warning("the swarm secret is short (%d characters): a stranger who records one handshake can try "
                    "guesses against it offline; `swarm-node --new-secret` makes a random one",
                    len(secret.value))
    if secret.source not in ("--secret", "$SWARM_SECRET") and readable_by_others(Path(secret.source)):
        log.warning("%s can be read by other users of this machine: chmod 600 it", secret.source)
