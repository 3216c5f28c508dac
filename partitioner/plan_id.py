"""A short, stable name for a plan, so nodes can tell they agree."""

from __future__ import annotations

import hashlib
import json
from typing import Sequence

from .model import ModelSpec, Stage

PLAN_ID_HEX_CHARS = 12


def plan_id(model: ModelSpec, stages: Sequence[Stage]) -> str:
    """Hash of the model spec and the stages only.

    Node speeds and memory are left out on purpose: a re-measured speed that
    does not move any layer keeps the same id, so nobody reloads for nothing.
    """
    payload = {"model": model.to_dict(), "stages": [s.to_dict() for s in stages]}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:PLAN_ID_HEX_CHARS]
