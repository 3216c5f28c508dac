"""Sampling defaults for fields a request leaves out (models/generation_defaults.py), and a node using them."""

from __future__ import annotations

import json
import shutil

from helpers import openai_client
from node_process import running_node

from swarm.models.generation_defaults import GenerationDefaults, generation_defaults


def with_config(tmp_path, config) -> object:
    (tmp_path / "generation_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return tmp_path


def test_greedy_without_a_generation_config(tmp_path):
    d = generation_defaults(tmp_path)
    assert (d.temperature, d.top_p, d.top_k, d.repetition_penalty) == (0.0, 1.0, 0, 1.0)


def test_the_models_recommendation_is_taken(tmp_path):
    d = generation_defaults(with_config(tmp_path, {"do_sample": True, "temperature": 0.7, "top_p": 0.8,
                                                   "top_k": 20, "repetition_penalty": 1.05, "max_length": 20}))
    assert (d.temperature, d.top_p, d.top_k, d.repetition_penalty) == (0.7, 0.8, 20, 1.05)
    assert "generation_config.json" in d.describe()


def test_do_sample_false_means_greedy_and_flags_win(tmp_path):
    with_config(tmp_path, {"do_sample": False, "temperature": 0.6, "top_p": 0.9})
    assert generation_defaults(tmp_path).temperature == 0.0
    d = generation_defaults(tmp_path, temperature=0.3, top_k=5)
    assert (d.temperature, d.top_p, d.top_k) == (0.3, 0.9, 5) and d.source.startswith("node flags")


def test_nonsense_in_the_config_is_left_out(tmp_path):
    assert generation_defaults(with_config(tmp_path, "{not json")) == GenerationDefaults(
        source="greedy: no generation_config.json")
    d = generation_defaults(with_config(tmp_path, {"temperature": -1, "top_p": "high", "top_k": True}))
    assert (d.temperature, d.top_p, d.top_k) == (0.0, 1.0, 0)


def test_a_node_fills_left_out_fields_from_the_generation_config(tmp_path, llama):
    model = shutil.copytree(llama, tmp_path / "llama")
    with_config(model, {"do_sample": True, "temperature": 1.3, "top_p": 0.7})
    with running_node(tmp_path, "--model", str(model)) as node:
        client = openai_client(node.url)
        ask = dict(model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=16, seed=9)
        left_out = client.chat.completions.create(**ask).choices[0].message.content
        assert left_out == client.chat.completions.create(temperature=1.3, top_p=0.7, **ask).choices[0].message.content
        assert left_out != client.chat.completions.create(temperature=0, **ask).choices[0].message.content
    with running_node(tmp_path, "--model", str(model), "--temperature", "0") as node:
        client = openai_client(node.url)
        assert client.chat.completions.create(**ask).choices[0].message.content == \
            client.chat.completions.create(temperature=0, **ask).choices[0].message.content
