"""Which requests a link carried from this node, so their entries hear when it breaks (stage/link_requests.py)."""

from __future__ import annotations

from swarm.stage.link_requests import Carried, LinkRequests
from swarm.transport.messages import Forward


def fwd(rid: str, entry: str, plan: str = "p1") -> Forward:
    return Forward(rid, plan, 0, 2, entry, None, "float32", (1, 1, 4), b"\0" * 16)


def test_a_broken_link_names_the_requests_sent_on_it_once_with_their_entry():
    carried = LinkRequests("mid")
    carried.note("last", fwd("r1", "entry-a"))
    carried.note("last", fwd("r2", "entry-b", "p2"))
    carried.note("other", fwd("r3", "entry-a"))
    assert sorted(carried.broken("last")) == [Carried("r1", "entry-a", "p1"), Carried("r2", "entry-b", "p2")]
    assert carried.broken("last") == []  # a new link starts clean
    assert carried.broken("other") == [Carried("r3", "entry-a", "p1")]


def test_own_requests_and_the_peers_own_are_not_noted_and_released_ones_are_forgotten():
    carried = LinkRequests("mid")
    carried.note("last", fwd("mine", "mid"))  # the node's own: it replays them itself
    carried.note("entry-a", fwd("theirs", "entry-a"))  # the peer is the entry: it sees the break itself
    carried.note("last", fwd("done", "entry-a"))
    carried.forget("done")
    assert len(carried) == 0 and carried.broken("last") == [] and carried.broken("entry-a") == []


def test_at_most_the_most_recent_per_peer_are_kept():
    carried = LinkRequests("mid", per_peer=3)
    for i in range(10):
        carried.note("last", fwd(f"r{i}", "entry-a"))
    carried.note("last", fwd("r7", "entry-a"))  # noted again: the most recent
    assert [c.rid for c in carried.broken("last")] == ["r8", "r9", "r7"]
