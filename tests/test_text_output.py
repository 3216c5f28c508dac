"""Streaming text equals tokenizer.decode of the tokens; stop strings cut it cleanly."""

from __future__ import annotations

import pytest
from mlx_lm.utils import load_tokenizer

from swarm.entry.text_output import TextOutput

TEXTS = ["Once upon a time, there was a little girl.", " leading space", "héllo wörld 😀 ünïcode",
         "numbers 12345 and\n\nnew lines\tand  double  spaces", "日本語のテキスト"]


@pytest.mark.parametrize("which", ["default", "qwen3"])
def test_streamed_text_equals_decode(which, default_model, tiny_models):
    path = default_model.path if which == "default" else tiny_models["qwen3"]
    tok = load_tokenizer(path)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        out = TextOutput(tok)
        streamed = "".join(out.add(t) for t in ids) + out.finish()
        assert streamed == tok.decode(ids)


def test_stop_strings_never_leak(default_model):
    tok = load_tokenizer(default_model.path)
    ids = tok.encode("The answer is forty-two. Next question please.", add_special_tokens=False)
    for stop, expected in [(". Next", "The answer is forty-two"), ("zzz", None), ("The", "")]:
        out = TextOutput(tok, [stop])
        pieces = [out.add(t) for t in ids] + [out.finish()]
        text = "".join(pieces)
        if expected is None:
            assert text == tok.decode(ids) and not out.stopped
        else:
            assert text == expected and out.stopped and out.stop_string == stop
        assert all(stop not in p for p in pieces)


def test_eos_text_is_not_shown(default_model):
    tok = load_tokenizer(default_model.path)
    ids = tok.encode("Hi there", add_special_tokens=False)
    out = TextOutput(tok)
    text = "".join(out.add(t) for t in ids) + out.add(tok.eos_token_id, eos=True) + out.finish()
    assert text == "Hi there"
