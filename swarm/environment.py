"""Every environment variable swarm reads, in one place: what it does and who reads it.

Modules read their variable through its `Variable` here, never by a bare name, so this list
is complete; `swarm-node --help` prints it (`help_text`). Command-line flags win over the
environment where both exist.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Variable:
    name: str
    meaning: str
    read_by: str

    def get(self, env: Mapping[str, str] | None = None) -> str | None:
        return (os.environ if env is None else env).get(self.name)

    def is_off(self, env: Mapping[str, str] | None = None) -> bool:
        return (self.get(env) or "").lower() == "off"


SECRET = Variable("SWARM_SECRET", "the swarm secret (--secret wins; else the state dir's `secret` file)",
                  "node/secrets.py")
API_KEY = Variable("SWARM_API_KEY", "the HTTP API's key (--api-key wins; else the state dir's `api-key` file); "
                   "swarm-tui sends it", "node/secrets.py, tui/app.py")
CACHE_DIR = Variable("SWARM_CACHE_DIR", "where converted and fetched models are kept (--cache-dir wins; "
                     "default $XDG_CACHE_HOME/swarm or ~/.cache/swarm)", "models/cache_dir.py")
XDG_CACHE_HOME = Variable("XDG_CACHE_HOME", "the cache root when $SWARM_CACHE_DIR is unset", "models/cache_dir.py")
XDG_STATE_HOME = Variable("XDG_STATE_HOME", "the state dir's root (--state-dir wins; default "
                          "~/.local/state/swarm): node id, secret, api-key, speed cache", "node/config.py")
STATE_DIR = Variable("SWARM_STATE_DIR", "the state dir of `python -m discovery` (the discovery package's own "
                     "tool, which knows nothing of swarm/)", "discovery/__main__.py")
BLAS = Variable("SWARM_BLAS", "`off`: keep MLX's bundled BLAS; a path: preload that BLAS library; unset: the "
                "node re-executes itself once with an optimized BLAS it finds (docs/blas.md)", "engine/blas.py")
BLAS_ACTIVE = Variable("SWARM_BLAS_ACTIVE", "set by that re-exec to the preloaded library (not for users)",
                       "engine/blas.py")
OPENBLAS_THREAD_TIMEOUT = Variable("OPENBLAS_THREAD_TIMEOUT", "OpenBLAS's thread spin; the BLAS re-exec sets a "
                                   "short one unless it is set", "engine/blas.py")
SODIUM = Variable("SWARM_SODIUM", "`off`: seal a hop's frames with `cryptography` instead of libsodium",
                  "transport/sodium_gcm.py")
HOP_TRACE = Variable("SWARM_HOP_TRACE", "a directory: each node appends a timeline of every frame it sends and "
                     "receives there (benchmarks/hop_profile.py); read at start", "transport/hop_trace.py")
DEVICE_STANDIN = Variable("SWARM_DEVICE_STANDIN", "for tests: a JSON device description with a \"kind\" (cuda, "
                          "metal, cpu) that this node describes its device as, instead of asking MLX (the arithmetic "
                          "still runs where MLX runs)", "backend.py")

ALLOWED_ORIGINS = Variable("SWARM_ALLOWED_ORIGINS", "web pages that may call the API, comma-separated "
                           "(--allowed-origins wins; api/origins.py)", "cli.py")
ALLOWED_HOSTS = Variable("SWARM_ALLOWED_HOSTS", "more names the API answers to, comma-separated "
                         "(--allowed-hosts wins; api/hosts.py)", "cli.py")
HOLD_FRAMES = Variable("SWARM_HOLD_FRAMES", "for tests: `PEER_ID:MS,...` (or `ADDRESS:MS`, `*:MS`): this node's data "
                       "lane holds every frame to those peers (or over links on those addresses) that long "
                       "before sending it (a slow link without netem)",
                       "transport/frame_hold.py")
PLAN_LINKS = Variable("SWARM_PLAN_LINKS", "`off`: plan as if no link had been measured; unset or anything "
                      "else: plan over the measured round trips (stage order, slow links left out; "
                      "benchmarks/link_aware_plan.py compares the two)",
                      "planning/link_view.py")

VARIABLES = (SECRET, API_KEY, CACHE_DIR, XDG_CACHE_HOME, XDG_STATE_HOME, STATE_DIR, BLAS, BLAS_ACTIVE,
             OPENBLAS_THREAD_TIMEOUT, SODIUM, HOP_TRACE, DEVICE_STANDIN, ALLOWED_ORIGINS, ALLOWED_HOSTS,
             HOLD_FRAMES, PLAN_LINKS)

# Read by swarm-bench only (other programs' variables it reports or is started with).
OPENBLAS_NUM_THREADS = Variable("OPENBLAS_NUM_THREADS", "OpenBLAS's threads: swarm-bench --blas-threads sets it "
                                "(with BLIS_ and MKL_NUM_THREADS) for itself and its nodes, and reports it",
                                "bench/__main__.py, bench/run.py")
MLX_HOSTFILE = Variable("MLX_HOSTFILE", "set by mlx.launch for swarm-bench's MLX ring baseline",
                        "bench/mlx_ring_pipeline.py")
BENCH_VARIABLES = (OPENBLAS_NUM_THREADS, MLX_HOSTFILE)


def help_text(width: int = 100) -> str:
    """The list for `swarm-node --help`."""
    indent = " " * (max(len(v.name) for v in VARIABLES) + 4)
    return "environment:\n" + "\n".join(
        textwrap.fill(v.meaning, width, initial_indent=f"  {v.name:<{len(indent) - 4}}  ", subsequent_indent=indent)
        for v in VARIABLES)
