"""Message types between nodes on the peer transport (headers; payloads are raw arrays).

Per generated token, a request makes one hop per stage boundary plus one back:
entry -> stage 0 -> ... -> last stage -> entry. When the entry node is stage 0
(the common case) the first hop is a local call, so K stages cost K network
messages per token: K-1 activations and 1 token id.
"""

from __future__ import annotations

FORWARD = "fwd"  # token ids (to stage 0) or hidden states (to later stages) for positions [pos, pos+L)
TOKEN = "tok"  # the last stage's sampled token, back to the entry node
ERROR = "err"  # a stage could not serve a request; sent to its entry node
RELEASE = "rel"  # the entry node is done with a request: free its KV caches


def forward(rid: str, plan_id: str, pos: int, start: int, entry: str, sampling: dict | None,
            compute_us: int = 0) -> dict:
    """`cu`: microseconds the stages so far spent computing this step (see hop_timing)."""
    return {"t": FORWARD, "rid": rid, "plan": plan_id, "pos": pos, "start": start, "entry": entry,
            "sampling": sampling, "cu": compute_us}


def token(rid: str, plan_id: str, at: int, token_id: int, compute_us: int = 0) -> dict:
    """`at` is the sequence position of the sampled token: the entry matches it to its request."""
    return {"t": TOKEN, "rid": rid, "plan": plan_id, "at": at, "token": token_id, "cu": compute_us}


def error(rid: str, plan_id: str, kind: str, message: str) -> dict:
    return {"t": ERROR, "rid": rid, "plan": plan_id, "kind": kind, "message": message}


def release(rid: str) -> dict:
    return {"t": RELEASE, "rid": rid}
