"""A profile's measured links: snapped to the advertised grid, bounded, refused when they lie, and
carried exactly by both encodings (discovery/link_costs.py)."""

from __future__ import annotations

import json
import math

import pytest

from discovery import link_costs
from discovery.profile import MAX_TXT_ENTRY, MalformedProfile, NodeProfile


def profile(**kw) -> NodeProfile:
    return NodeProfile(**{"node_id": "self", "name": "n", "swarm": "s", "api_port": 8800, "peer_port": 8801, **kw})


def peers(n: int) -> list[str]:
    return [f"{i:016x}" for i in range(n)]  # the length of a minted id (16 hex digits)


def test_links_round_trip_both_encodings_exactly():
    p = profile(links={"a": (0.0301, 12.5e6), "b": (0.00021, 0.0), "c": (2.0, 1.2e9)})
    assert NodeProfile.from_txt(p.to_txt()) == p
    assert NodeProfile.from_json(p.to_json()) == p
    assert NodeProfile.from_json(p.to_json()).links == p.links
    assert json.loads(p.to_json())["links"]["b"] == [p.links["b"][0], 0.0]  # bandwidth unknown stays 0


def test_values_are_snapped_to_the_grid():
    p = profile(links={"a": (0.0301, 12.5e6)})
    rtt, bw = p.links["a"]
    assert 0.0301 / 1.1 < rtt < 0.0301 * 1.1 and 12.5e6 / 1.2 < bw < 12.5e6 * 1.2
    assert profile(links={"a": (0.0302, 12.6e6)}).links == p.links  # noise under a step is no change
    assert profile(links=p.links) == p


def test_a_txt_record_with_64_peers_stays_within_limits():
    links = {peer: (1e-4 * (i + 1), 1e6 * (i + 1)) for i, peer in enumerate(peers(64))}
    p = profile(links=links)
    txt = p.to_txt()
    assert all(len(k.encode()) + 1 + len(v.encode()) <= MAX_TXT_ENTRY for k, v in txt.items())
    link_bytes = sum(len(k) + 2 + len(v) for k, v in txt.items() if link_costs.is_txt_key(k))
    assert link_bytes <= link_costs.MAX_TXT_BYTES
    assert sum(len(k) + 2 + len(v) for k, v in txt.items()) < 1500  # the whole record: about one frame
    back = NodeProfile.from_txt({k.encode(): v.encode() for k, v in txt.items()})  # as zeroconf gives it
    assert back == p and len(back.links) == 64


@pytest.mark.parametrize("links, says", [
    ({p: (0.001, 1e6) for p in peers(65)}, "at most 64"),
    ({"x" * 60 + str(i): (0.001, 1e6) for i in range(30)}, "bytes in the TXT record"),
    ({"a": (-0.001, 1e6)}, "round trip"),
    ({"a": (0.0, 1e6)}, "round trip"),
    ({"a": (math.nan, 1e6)}, "round trip"),
    ({"a": (math.inf, 1e6)}, "round trip"),
    ({"a": (1e6, 1e6)}, "round trip"),
    ({"a": (0.001, -5.0)}, "bandwidth"),
    ({"a": (0.001, math.inf)}, "bandwidth"),
    ({"a": (0.001, 1e30)}, "bandwidth"),
    ({"a": (True, 1e6)}, "two numbers"),
    ({"a": ("0.001", 1e6)}, "two numbers"),
    ({"a": (0.001,)}, "round-trip seconds"),
    ({"a": 0.001}, "round-trip seconds"),
    ({"self": (0.001, 1e6)}, "itself"),
    ({"a,b": (0.001, 1e6)}, "peer id"),
    ({"a b": (0.001, 1e6)}, "peer id"),
    ({"": (0.001, 1e6)}, "peer id"),
    ({"x" * 65: (0.001, 1e6)}, "peer id"),
    ({7: (0.001, 1e6)}, "peer id"),
    ([("a", (0.001, 1e6))], "object"),
])
def test_a_lying_or_malformed_links_field_is_refused(links, says):
    with pytest.raises(MalformedProfile, match=says):
        profile(links=links)
    good = json.loads(profile().to_json())
    with pytest.raises(MalformedProfile, match=says):  # from a peer's JSON profile alike
        NodeProfile.from_dict({**good, "links": links if isinstance(links, list) else
                               {k: list(v) if isinstance(v, tuple) else v for k, v in links.items()}})


@pytest.mark.parametrize("entries, says", [
    ({"lk0": "a"}, "is not"),  # too short for two codes and an id
    ({"lk0": "!!peer"}, "is not"),  # not codes
    ({"lk0": "00a,00a"}, "twice"),
    ({"lk0": "00a", "lk1": "01a"}, "twice"),
    ({"lk0": "00self"}, "itself"),
    ({"lk0": ",".join(f"00{p}" for p in peers(65))}, "at most 64"),
])
def test_a_malformed_txt_links_entry_is_refused(entries, says):
    txt = {**profile().to_txt(), **entries}
    with pytest.raises(MalformedProfile, match=says):
        NodeProfile.from_txt(txt)
    with pytest.raises(MalformedProfile):
        NodeProfile.from_txt({**txt, "lk0": b"\xff\xfe"})


def test_links_survive_replace_and_leave_hints_out():
    p = profile(links={"a": (0.001, 1e6)}).replace(speed=0.01, extra={"state": "serving"})
    assert p.links == profile(links={"a": (0.001, 1e6)}).links
    assert p.as_hint().links == {}
    assert p.replace(links={}).links == {}


def test_a_profile_without_links_reads_as_none():
    data = json.loads(profile().to_json())
    del data["links"]  # a peer of an earlier build
    assert NodeProfile.from_dict(data).links == {}
    assert not any(link_costs.is_txt_key(k) for k in profile().to_txt())
