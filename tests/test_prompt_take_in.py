"""New prompts are taken in between passes, on a real node process with the official openai client.

On a node that is its own next stage (one node), a request's decode steps follow each
other on the MLX thread, and new requests' prompts, posted by the event loop, waited for
the whole stream to end (engine/worker.py `mlx_take_in`).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from swarm.bench.cluster import LocalCluster
from helpers import openai_client

pytestmark = pytest.mark.timeout(300)


def test_a_new_request_is_answered_while_another_streams_on_one_node(model: Path, tmp_path: Path) -> None:
    eos = json.loads((model / "config.json").read_text())["eos_token_id"]
    with LocalCluster(1, tmp_path, str(model), memory_limit="1G", ready_timeout=120) as cluster:
        client = openai_client(cluster.entry.url)
        model_id = client.models.list().data[0].id
        long_chunks: list[float] = []
        started = threading.Event()

        def long_stream() -> str | None:
            stream = client.chat.completions.create(
                model=model_id, messages=[{"role": "user", "content": "Go on and on."}], max_tokens=1500,
                temperature=0, logit_bias={str(eos): -100}, stream=True)  # never ends early
            finish = None
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    long_chunks.append(time.monotonic())
                    if len(long_chunks) == 20:
                        started.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            return finish

        with ThreadPoolExecutor(1) as pool:
            long_one = pool.submit(long_stream)
            assert started.wait(120)
            short = client.chat.completions.create(model=model_id, max_tokens=2, temperature=0,
                                                   messages=[{"role": "user", "content": "Hi."}])
            answered = time.monotonic()
            assert long_one.result(timeout=240) == "length"
    assert short.choices[0].message.content is not None
    after = sum(1 for t in long_chunks if t > answered)
    assert after >= 100, (f"the short request was answered when the long stream had {len(long_chunks) - after} "
                          f"of its {len(long_chunks)} tokens: it waited for the stream instead of joining it")
