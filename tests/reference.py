"""What one machine produces: greedy tokens from mlx-lm on the whole model.

mlx-lm reads the prompt in chunks of the swarm's default chunk for a prompt alone at its entry (its
prefill_step_size; entry/prompt_chunks.py), the backend's (a node of a test runs where this process
does): the same schedule as a request that runs alone, so a prompt longer than one chunk gives the same
text to the last bit. (Beside other requests a node reads prompts in smaller chunks: other boundaries,
other rounding.)

reference_chat, the text a node's answer is compared with, runs under the BLAS the nodes of this machine
run under: where a node re-executes itself with an optimized BLAS preloaded (engine/blas.py), it runs in
a worker process started the same way (reference_worker.py), several times faster on a CPU than the
bundled reference BLAS this process keeps for the tests that compare computations of its own bit for
bit. The other functions run in this process.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
from functools import lru_cache
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model, load_tokenizer

from swarm.entry.generate import default_prefill_alone

PREFILL_STEP = default_prefill_alone()


@lru_cache(maxsize=4)
def _load(model_dir: str):
    model, config = load_model(Path(model_dir))
    return model, load_tokenizer(Path(model_dir), eos_token_ids=config.get("eos_token_id"))


def chat_prompt(model_dir, messages: list[dict]) -> list[int]:
    """The prompt tokens of a chat, as the model's own chat template writes them."""
    _, tok = _load(str(model_dir))
    return tok.apply_chat_template(messages, add_generation_prompt=True)


def reference_chat(model_dir, messages: list[dict], max_tokens: int) -> tuple[str, int]:
    """(text, completion tokens) of a greedy chat completion, stopping at end-of-sequence, under the BLAS
    a node started now would run under (SWARM_BLAS as it is set now)."""
    blas = node_blas()
    if blas is None:
        return local_reference_chat(model_dir, messages, max_tokens)
    return _worker(blas).ask({"model": str(model_dir), "messages": messages, "max_tokens": max_tokens})


def local_reference_chat(model_dir, messages: list[dict], max_tokens: int) -> tuple[str, int]:
    """reference_chat in this process, under its BLAS."""
    model, tok = _load(str(model_dir))
    prompt = chat_prompt(model_dir, messages)
    tokens = []
    for (t, _), _ in zip(generate_step(mx.array(prompt), model, max_tokens=max_tokens,
                                                   prefill_step_size=PREFILL_STEP), range(max_tokens)):
        tokens.append(int(t))
        if int(t) in tok.eos_token_ids:
            break
    text_tokens = tokens[:-1] if tokens and tokens[-1] in tok.eos_token_ids else tokens
    return tok.decode(text_tokens), len(tokens)


def reference_tokens(model_dir, prompt: list[int], n: int,
                     prefill_step: int = PREFILL_STEP) -> list[tuple[int, np.ndarray]]:
    """Greedy (token, log-softmax of the logits it was drawn from) pairs, as mlx-lm's generate_step gives."""
    model, _ = _load(str(model_dir))
    return [(int(t), np.array(lp.astype(mx.float32)))
            for (t, lp), _ in zip(generate_step(mx.array(prompt), model, max_tokens=n,
                                                prefill_step_size=prefill_step), range(n))]


def reference_prompt_logprobs(model_dir, prompt: list[int]) -> np.ndarray:
    """log-softmax of the whole model's logits at every prompt position: row q scores token q + 1."""
    model, _ = _load(str(model_dir))
    logits = model(mx.array(prompt)[None])[0].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))


def reference_with_penalties(model_dir, prompt: list[int], n: int, bias: dict, presence: float,
                             frequency: float) -> list[int]:
    """OpenAI's definition written out: logit + bias - presence * [count > 0] - frequency * count,
    counting generated tokens only; greedy, the whole model run afresh at every step."""
    model, _ = _load(str(model_dir))
    tokens: list[int] = []
    for _ in range(n):
        logits = np.array(model(mx.array(prompt + tokens)[None])[0, -1].astype(mx.float32))
        counts = np.bincount(tokens, minlength=logits.shape[0]).astype(np.float32)
        for t, b in bias.items():
            logits[t] += b
        logits -= presence * (counts > 0) + frequency * counts
        tokens.append(int(np.argmax(logits)))
    return tokens


def node_blas() -> Path | None:
    """The optimized BLAS a node started now re-executes itself with (engine/blas.py), or None when it
    keeps the one this process has."""
    from swarm.engine.blas import blas_to_preload
    return blas_to_preload(dict(os.environ))


def node_blas_env(blas: Path) -> dict[str, str]:
    """This process's environment as a node's re-exec under `blas` has it, one BLAS thread as every test
    node runs (swarm_cluster.py)."""
    from swarm.engine.blas import reexec_env
    return {"OPENBLAS_NUM_THREADS": "1", **reexec_env(blas, dict(os.environ))}


class _Worker:
    """reference_worker.py under `blas`: one JSON line in, one out, a request at a time."""

    def __init__(self, blas: Path):
        env = node_blas_env(blas)
        here = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([sys.executable, str(Path(here) / "reference_worker.py")], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lock = threading.Lock()
        atexit.register(self.close)

    def ask(self, request: dict) -> tuple[str, int]:
        with self.lock:
            assert self.proc.stdin and self.proc.stdout
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"reference_worker.py exited with {self.proc.wait()}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"reference_worker.py: {reply['error']}")
        return reply["text"], reply["n"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_workers: dict[Path, _Worker] = {}
_workers_lock = threading.Lock()


def _worker(blas: Path) -> _Worker:
    with _workers_lock:
        worker = _workers.get(blas)
        if worker is None or worker.proc.poll() is not None:
            worker = _workers[blas] = _Worker(blas)
        return worker
