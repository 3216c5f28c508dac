"""A real node started with `--draft-model` (entry/draft_model.py), through the official openai client: greedy
chat gives the same text as without drafts (mlx-lm's), a seeded sampled request the same text, and /health
counts the draft model's drafts. A draft model the node cannot use is refused at start, with the reason."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from helpers import openai_client
from node_process import running_node
from reference import reference_chat

MESSAGES = [{"role": "user", "content": "Once upon a time, there was a little robot who loved to count"}]


@pytest.fixture(scope="module")
def drafting_node(tmp_path_factory, llama):
    """A node whose draft model is the served model itself: every draft is accepted."""
    with running_node(tmp_path_factory.mktemp("node"), "--model", str(llama), "--speculate", "draft",
                      "--draft-model", str(llama)) as node:
        yield node


def speculation(node) -> dict:
    status, body = node.health()
    assert status == 200
    return body["speculation"]


def test_greedy_chat_is_the_same_with_the_draft_model(drafting_node, llama):
    client = openai_client(drafting_node.url)
    before = speculation(drafting_node)
    assert before["mode"] == "draft" and before["draft_model"] == llama.name
    text, _ = reference_chat(llama, MESSAGES, 30)
    on = client.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=30, temperature=0)
    after = speculation(drafting_node)
    off = client.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=30, temperature=0,
                                         extra_body={"speculate": False})
    assert on.choices[0].message.content == off.choices[0].message.content == text
    assert after["drafts_proposed"] > before["drafts_proposed"]
    assert after["drafts_accepted"] > before["drafts_accepted"]
    assert speculation(drafting_node)["drafts_proposed"] == after["drafts_proposed"], "speculate: false"


def test_seeded_sampling_is_the_same_with_the_draft_model(drafting_node):
    client = openai_client(drafting_node.url)
    kwargs = dict(model="llama", prompt="The quick brown fox", max_tokens=24, temperature=0.7, seed=11)
    on = client.completions.create(**kwargs)
    off = client.completions.create(**kwargs, extra_body={"speculate": False})
    assert on.choices[0].text == off.choices[0].text


def run_node(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "swarm.cli", "--api-port", "0", "--peer-port", "0", "--no-mdns",
                           "--state-dir", str(tmp_path / "s"), *args], capture_output=True, text=True, timeout=120)


def test_a_draft_model_the_node_cannot_use_is_refused_at_start(tmp_path, llama):
    swapped = tmp_path / "swapped"
    shutil.copytree(llama, swapped)
    spec = json.loads((swapped / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["he"], vocab["ar"] = vocab["ar"], vocab["he"]
    (swapped / "tokenizer.json").write_text(json.dumps(spec))
    r = run_node(tmp_path, "--model", str(llama), "--draft-model", str(swapped))
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("swarm-node: error:"), r.stderr
    assert str(swapped) in line and "llama" in line and "vocabular" in line, line

    r = run_node(tmp_path, "--model", str(llama), "--speculate", "draft")
    assert r.returncode == 2 and "--draft-model" in r.stderr, r.stderr
