"""A forward's header is checked once, each condition naming what is wrong: no fast check that
lets through what the explaining one would refuse."""

from __future__ import annotations

import numpy as np
import pytest

from swarm.engine.sampling import SamplingParams
from swarm.transport.errors import ProtocolError
from swarm.transport.frames import Frame
from swarm.transport.messages import Forward


def frame(**changes) -> Frame:
    header, payload = Forward.of_tokens("r1", "p1", 0, "e1", SamplingParams(), [1, 2]).to_frame()
    return Frame({**header, **changes}, payload)


def test_a_well_formed_forward_passes():
    assert Forward.from_frame(frame()).token_ids() is None and Forward.from_frame(frame()).length == 2


@pytest.mark.parametrize("changes, named", [
    ({"shape": [True, 2]}, "shape must be [1, length]"),  # a bool is not a batch of one
    ({"shape": [1, 2, 4]}, "shape must be [1, length]"),
    ({"dtype": "float32"}, "must be int32"),
    ({"pos": -1}, "'pos' must be an integer"),
    ({"rid": ""}, "'rid' must be a string"),
    ({"entry": 7}, "'entry' must be a string"),
    ({"cu": True}, "'cu' must be an integer"),
    ({"start": "0"}, "'start' must be an integer"),
])
def test_each_problem_is_named(changes, named):
    with pytest.raises(ProtocolError, match=named.replace("[", r"\[").replace("]", r"\]")):
        Forward.from_frame(frame(**changes))


def test_a_hidden_state_forward_needs_its_width():
    h = np.zeros((1, 2, 8), np.float32)
    header, payload = Forward("r1", "p1", 0, 3, "e1", None, "float32", h.shape, h.tobytes()).to_frame()
    assert Forward.from_frame(Frame(header, payload)).shape == (1, 2, 8)
    with pytest.raises(ProtocolError, match="needs 64 bytes, got 32"):
        Forward.from_frame(Frame(header, payload[:32]))
