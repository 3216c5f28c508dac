"""Why a handshake failed is said once per node, address and reason: each node keeps its own count
(LinkAuth.refusals), so a second node in the same process still says why, and no test resets a
process-wide one by hand."""

from __future__ import annotations

import logging

import pytest
from peer_nodes import PeerNode, token, transport_warnings

from swarm.transport.errors import PeerUnreachable
from swarm.transport.link_crypto import stretch_secret

pytestmark = pytest.mark.timeout(120)

KEY = stretch_secret("a test secret, long enough 7c41")
OTHER_KEY = stretch_secret("another secret altogether 0be9")


async def test_every_node_says_once_why_its_hello_failed(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="swarm.transport")
    addresses: dict[str, tuple[str, int]] = {}
    b = await PeerNode("node-b", addresses, key=KEY).start()
    dialers = [await PeerNode(name, addresses, key=OTHER_KEY).start() for name in ("node-a", "node-c")]
    try:
        for dialer in dialers:
            for i in range(3):
                with pytest.raises(PeerUnreachable, match="auth"):
                    await dialer.send("node-b", token(i))
        mine = [w for w in transport_warnings(caplog) if "our hello" in w]
        assert len(mine) == 2, transport_warnings(caplog)  # one for each dialing node, for three tries each
    finally:
        for node in (*dialers, b):
            await node.stop()
