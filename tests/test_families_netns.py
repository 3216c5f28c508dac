"""Families the old shard got wrong, split over 3 real hosts: the same text as mlx-lm alone.

gpt_oss (sliding-window layers beside full ones; the chat runs well past its
window of 8), deepseek_v3 (MLA attention that needs an array mask, dense and
expert layers; Kimi K2 is the same class) and gemma3_text (embeddings scaled in
the model's own forward, sliding layers). Each random model runs on 3
`swarm-node` processes on separate network-namespace hosts: a plain request and
a streaming one from different entry nodes, then a stream during which a stage
is killed with SIGKILL; every text must equal mlx-lm's greedy text on the whole
model in this process.
"""

from __future__ import annotations

import time

import pytest
from helpers import chat_body, streamed_text
from model_zoo import build_random_model
from netns import netns_unavailable_reason
from netns_client import Stream
from reference import reference_chat
from swarm_cluster import SwarmCluster

pytestmark = pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason()))

MESSAGES = [{"role": "user", "content": "Tell me a long story about the sea, the river and the robot."}]
TOKENS = 28


@pytest.mark.parametrize("family", ["gpt_oss", "deepseek_v3", "gemma3_text"])
def test_family_over_three_hosts_like_mlx_lm_alone(tmp_path, family):
    model = build_random_model(tmp_path / family, family, seed=2)
    expected, n_tokens = reference_chat(model, MESSAGES, TOKENS)
    assert n_tokens == TOKENS and len(set(expected)) > 3, "the test model must not stop or loop at once"
    cluster = SwarmCluster(tmp_path / "swarm", 3, ["--model", str(model), "--recovery-timeout", "60"])
    try:
        topology = cluster.wait_serving(stages=3)
        assert [s["end"] - s["start"] for s in topology["plan"]["stages"]] == [2, 2, 2]
        body = chat_body(MESSAGES, TOKENS)
        status, reply = cluster.nodes[0].post("/v1/chat/completions", body)
        assert status == 200, reply
        assert reply["choices"][0]["message"]["content"] == expected
        assert reply["usage"]["completion_tokens"] == TOKENS and len(reply["swarm"]["path"]) == 3
        assert streamed_text(cluster.nodes[1].stream("/v1/chat/completions", body)) == expected

        stream = Stream(cluster.nodes[0], body)
        stream.wait_tokens(4)
        victim = cluster.nodes[2]
        victim.proc.kill9()
        killed_at = time.monotonic()
        assert stream.finish() == expected, "the stream must go on through the death with the same text"
        assert stream.gap_after(killed_at) < 30
    finally:
        cluster.close()
