"""2,000 connections that complete the hello, at one node without a secret (issue 19), on loopback.

An open node lets anyone say hello; what it must not let them do is take its file
descriptors. The node runs with 1,024 descriptors, as a default Linux login gives:
a node that kept every connection would run out, and its API and peers with it.
"""

from __future__ import annotations

import concurrent.futures
import os
import resource
import socket
import time

import pytest
from discovery.profile import PROTOCOL_VERSION
from node_process import running_node
from swarm.bench.cluster import get_json
from reference import reference_chat
from stranger import flood

pytestmark = pytest.mark.timeout(300)


def post_chat(url: str, question: str) -> tuple[int, dict]:
    import json
    import urllib.error
    import urllib.request
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": 12, "temperature": 0}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except OSError as e:
        return 0, {"error": str(e)}


def test_two_thousand_hellos_leave_an_open_node_serving_with_bounded_descriptors(tmp_path, llama):
    question = "Say hello in Spanish."
    expected, _ = reference_chat(llama, [{"role": "user", "content": question}], 12)
    with running_node(tmp_path, "--model", str(llama), "--speed", "0.002") as node:
        pid = node.proc.pid
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (1024, 1024))
        before = len(os.listdir(f"/proc/{pid}/fd"))
        peak = [before]

        def sample() -> None:
            try:
                peak[0] = max(peak[0], len(os.listdir(f"/proc/{pid}/fd")))
            except OSError:
                pass

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            flooding = pool.submit(flood, "127.0.0.1", node.peer_port, "default", PROTOCOL_VERSION, 2000, 12.0,
                                   sample)  # opened in a few s, then held past every hello timeout
            time.sleep(3)
            replies = []
            while not flooding.done():
                replies.append(post_chat(node.url, question))
                sample()
                time.sleep(1)
            counts = flooding.result()
        time.sleep(1)
        after = len(os.listdir(f"/proc/{pid}/fd"))
        print(f"\n2,000 hellos at an open node: {counts}; descriptors {before} before, at most {peak[0]} during, "
              f"{after} after; chats during the flood: {[s for s, _ in replies]}")
        assert node.proc.poll() is None
        # At most 32 held per address, plus what asyncio accepts in a round before they are closed (100 a
        # round; a loaded machine closes them late: 383 seen in a full run under load). Unbounded, the node
        # would hold all 2,000 and hit its limit of 1,024.
        assert peak[0] <= before + 512, f"descriptors grew from {before} to {peak[0]}"
        assert after <= before + 5, f"descriptors {before} before, {after} after"
        assert replies and all(s == 200 and r["choices"][0]["message"]["content"] == expected for s, r in replies)
        status, health = get_json(node.url + "/health")
        assert status == 200, health
        log = node.log.read_text()
        print(f"log: {len(log.splitlines())} lines, {log.count('Traceback')} tracebacks")
        assert log.count("Traceback") < 20 and len(log.splitlines()) < 500, log[-3000:]
        with socket.create_connection(("127.0.0.1", node.peer_port), timeout=5):
            pass  # the peer port still accepts
