"""A node's state in its profile is one of NodeState: our own typo fails where it is made, a peer's
unknown state is taken as no state (with a log line), never as a string nobody checks."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from discovery import MalformedProfile, NodeProfile, NodeState


def profile(**extra: str) -> NodeProfile:
    return NodeProfile(node_id="n1", name="one", swarm="s", api_port=8000, peer_port=9000, extra=extra)


def test_a_known_state_reads_back_typed_from_every_encoding():
    p = profile(state="serving")
    assert p.state is NodeState.SERVING
    assert NodeProfile.from_json(p.to_json()).state is NodeState.SERVING
    assert NodeProfile.from_txt(p.to_txt()).state is NodeState.SERVING
    assert profile().state is None


def test_our_own_typo_fails_where_it_is_made():
    p = profile()
    assert p.replace(state=NodeState.FETCHING).state is NodeState.FETCHING
    assert p.replace(state=NodeState.FETCHING).extra["state"] == "fetching"
    with pytest.raises(ValueError, match="unknown node state 'servin'"):
        p.replace(state="servin")
    with pytest.raises(MalformedProfile, match="state 'lookin'"):
        profile(state="lookin")


def test_a_peers_unknown_state_is_taken_as_none_and_said(caplog):
    data = profile(state="serving", plan="p1").to_dict()
    data["extra"]["state"] = "hibernating"  # a newer build's state, or garbage
    with caplog.at_level(logging.WARNING, logger="discovery.profile"):
        p = NodeProfile.from_dict(data)
    assert p.state is None and p.extra == {"plan": "p1"} and p.node_id == "n1"
    assert "hibernating" in caplog.text
    txt = {**profile().to_txt(), "x.state": "hibernating"}
    assert NodeProfile.from_txt(txt).state is None


def test_the_api_reference_lists_every_state():
    text = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    assert all(f"`{s.value}`" in text for s in NodeState)
