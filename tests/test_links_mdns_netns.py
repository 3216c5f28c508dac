"""A profile with the most links it may carry crosses real mDNS whole: a `python -m discovery` node
advertises 64 measured links, and its TXT record, asked for over multicast from another host, reads
back to the same links (and its peer sees them in its view)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from netns_client import in_netns

from discovery.profile import SERVICE_TYPE, NodeProfile

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parent.parent
LINKS = {f"{i:016x}": [1e-4 * (i + 1), 1e6 * (i + 1)] for i in range(64)}


def start(host, state_dir: Path, name: str):
    argv = [sys.executable, "-m", "discovery", "--name", name, "--state-dir", str(state_dir), "--peer-port", "7946",
            "--listen", host.ip, "--interface", host.ip]
    return host.spawn(argv, cwd=REPO, label=name, stdin=True)


def txt_record(ip: str, instance: str) -> dict:
    from zeroconf import ServiceInfo, Zeroconf
    zc = Zeroconf(interfaces=[ip])
    try:
        info = ServiceInfo(SERVICE_TYPE, f"swarm-{instance}.{SERVICE_TYPE}")
        assert info.request(zc, 5000), "no answer over mDNS"
        return dict(info.properties)
    finally:
        zc.close()


def test_64_links_cross_mdns_whole(netns_hosts, tmp_path):
    h1, h2 = netns_hosts(2)
    a, b = start(h1, tmp_path / "a", "a"), start(h2, tmp_path / "b", "b")
    ready = a.wait_event("ready", 10)
    b.wait_event("ready", 10)
    b.wait_event("join", 20, node_id=ready["node_id"])
    mark = b.mark()
    a.send({"update": {"links": LINKS}})
    seen = b.wait_for(lambda e: e.get("event") == "update" and len(e["profile"]["links"]) == 64, 20, mark)
    txt = in_netns(h2.ns, txt_record, h2.ip, ready["profile"]["instance"])
    assert sum(len(k) + len(v or b"") + 2 for k, v in txt.items()) < 1500
    profile = NodeProfile.from_txt(txt)
    assert profile.links == NodeProfile.from_dict(seen["profile"]).links
    assert len(profile.links) == 64 and profile.links["0000000000000000"][0] == pytest.approx(1e-4, rel=0.15)
