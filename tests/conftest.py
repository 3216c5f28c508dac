from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest
from netns import Host, Network, netns_unavailable_reason


@pytest.fixture
def netns_hosts(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[int], list[Host]]]:
    """Factory: `hosts = netns_hosts(3)` -> 3 hosts on one private bridge.

    Each call builds a separate network. Everything is torn down after the
    test, pass or fail; process logs are printed when the test failed.
    """
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    networks: list[Network] = []
    failed_before = request.session.testsfailed

    def make_hosts(n: int) -> list[Host]:
        network = Network(tmp_path / f"net{len(networks)}")
        networks.append(network)
        return network.add_hosts(n)

    try:
        yield make_hosts
    finally:
        for network in networks:
            if request.session.testsfailed > failed_before:
                print(network.logs())
            network.close()
