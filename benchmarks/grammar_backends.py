"""Three grammar libraries behind one small interface, for benchmarks/grammar_libraries.py.

The swarm itself uses llguidance only (swarm/engine/constraints.py); this module exists so the
choice can be measured again. Taken from the issue-18 investigation (lab18/grammars.py).

Three libraries that compile a JSON schema (or a grammar) against a tokenizer and, token by token,
fill a bitmask of the tokens allowed next: llguidance, xgrammar, outlines-core. All three fill the
same layout: int32[ceil(V/32)], bit i%32 of word i//32 set when token i is allowed (little-endian
bit order), so applying the mask to the logits is library-independent (apply_mask_numpy below).

Each backend is built from the model directory's tokenizer.json alone (a Hugging Face `tokenizers`
file; byte-level BPE for the default model), never from a model hub.

Backend interface (all times are the caller's business):
    b = BACKENDS[name](tokenizer_json_text, vocab_size, eos_ids)   # once per model and process
    compiled = b.compile(spec)          # spec: Spec (json_schema / json_object / tool call)
    m = b.matcher(compiled)             # fresh per-request state
    b.fill(m, bitmask)                  # bitmask: np.int32[1, ceil(V/32)], C-contiguous
    b.advance(m, token) -> bool         # False: token not allowed (the state is then undefined)
    b.done(m) -> bool                   # the grammar is complete (only EOS may follow)
    b.clone(m) -> matcher               # independent copy
    b.rollback(m, n)                    # undo the last n tokens
    b.rebuild(compiled, tokens)         # a new matcher that has consumed `tokens`
"""

from __future__ import annotations

import json
import re
import sys
import types
from dataclasses import dataclass

import numpy as np

# ---------------------------------------------------------------------------------------------
# Grammar specs: what an OpenAI request asks for, in a library-neutral form.


@dataclass(frozen=True)
class Spec:
    kind: str  # "json_object" | "json_schema" | "tool_call"
    schema: dict | None = None  # json_schema: the schema; tool_call: the call object's schema
    prefix: str = ""  # tool_call: literal text before the JSON (the template's call marker)
    suffix: str = ""  # tool_call: literal text after it

    def wire_text(self) -> str:
        """What would travel to another node to rebuild this grammar (compact JSON)."""
        return json.dumps({"kind": self.kind, "schema": self.schema, "prefix": self.prefix,
                           "suffix": self.suffix}, separators=(",", ":"))


def tool_call_schema(tools: list[dict], choice: str | dict = "required") -> dict:
    """The JSON object a forced tool call must be: {"name": <one of the tools>, "arguments": {...}}.

    tools: OpenAI `tools` entries ({"type": "function", "function": {name, parameters}});
    choice: "required" (any of them) or {"type": "function", "function": {"name": ...}}.
    """
    fns = [t["function"] for t in tools]
    if isinstance(choice, dict):
        fns = [f for f in fns if f["name"] == choice["function"]["name"]]
    alts = [{"type": "object",
             "properties": {"name": {"const": f["name"]},
                            "arguments": f.get("parameters") or {"type": "object"}},
             "required": ["name", "arguments"], "additionalProperties": False} for f in fns]
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


# JSON whitespace: fixed separators like json.dumps (", " and ": "), no free whitespace. Free
# whitespace lets a small model loop on newlines/spaces until max_tokens (a known failure mode of
# whitespace-flexible JSON grammars); all three backends are configured the same way.
ITEM_SEP, KEY_SEP = ", ", ": "


# ---------------------------------------------------------------------------------------------
# Applying a bitmask to an mx.array of logits (shared by all backends).


def mask_bool_numpy(bitmask: np.ndarray, vocab: int) -> np.ndarray:
    return np.unpackbits(bitmask.reshape(-1).view(np.uint8), bitorder="little")[:vocab].view(np.bool_)


def apply_mask_numpy(logits, bitmask: np.ndarray):
    """np.unpackbits on the host, then one mx.where. logits: mx.array (..., V)."""
    import mlx.core as mx
    v = logits.shape[-1]
    allowed = mx.array(mask_bool_numpy(bitmask, min(v, bitmask.size * 32)))
    if allowed.shape[0] < v:  # model vocab padded past the tokenizer: padding never allowed
        allowed = mx.concatenate([allowed, mx.zeros((v - allowed.shape[0],), dtype=mx.bool_)])
    return mx.where(allowed, logits, -mx.inf)


# ---------------------------------------------------------------------------------------------
# Tokenizer helpers.


def byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE: the printable character standing for each byte, inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def vocab_strings(tokenizer_json: dict, vocab_size: int) -> tuple[list[str], set[int]]:
    """Token strings in id order (as stored, byte-level encoded) and the ids of special added tokens."""
    out = [""] * vocab_size
    for s, i in tokenizer_json["model"]["vocab"].items():
        if i < vocab_size:
            out[i] = s
    special = set()
    for a in tokenizer_json.get("added_tokens", []):
        if a["id"] < vocab_size:
            out[a["id"]] = a["content"]
            if a.get("special"):
                special.add(a["id"])
    return out, special


def is_byte_level(tokenizer_json: dict) -> bool:
    dec = tokenizer_json.get("decoder") or {}
    if dec.get("type") == "ByteLevel":
        return True
    return any(d.get("type") == "ByteLevel" for d in dec.get("decoders", []) or [])


# ---------------------------------------------------------------------------------------------
# llguidance


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: list[int]):
        import llguidance as llg
        from llguidance.numpy import fill_next_token_bitmask
        self.llg, self._fill = llg, fill_next_token_bitmask
        # LLTokenizer takes the tokenizer.json text itself; special tokens are never allowed
        # as text (they are only reachable as EOS).
        self.tok = llg.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos_ids)
        self.version = _dist_version("llguidance")

    def grammar_text(self, spec: Spec) -> str:
        llg = self.llg
        opts = {"whitespace_flexible": False, "item_separator": ITEM_SEP, "key_separator": KEY_SEP}
        if spec.kind == "json_object":
            return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=opts)
        if spec.kind == "json_schema":
            return llg.LLMatcher.grammar_from_json_schema(spec.schema, overrides=opts)
        # Lark with an embedded JSON schema: literal markers around the call object.
        lark = (f"start: {json.dumps(spec.prefix)} call {json.dumps(spec.suffix)}\n"
                f"call: %json {json.dumps({**spec.schema, 'x-guidance': opts})}\n")
        return llg.LLMatcher.grammar_from_lark(lark)

    def compile(self, spec: Spec):
        # The grammar string is the whole "compiled" form: an LLMatcher builds its lexer lazily.
        g = self.grammar_text(spec)
        err = self.llg.LLMatcher.validate_grammar(g, self.tok)
        if err and not err.startswith("WARNING"):
            raise ValueError(err)
        return g

    def matcher(self, compiled):
        m = self.llg.LLMatcher(self.tok, compiled, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def fill(self, m, bitmask):
        self._fill(m, bitmask, 0)

    def advance(self, m, token):
        return m.consume_token(token)

    def done(self, m):
        return m.is_stopped() or m.is_accepting()

    def clone(self, m):
        return m.deep_copy()

    def rollback(self, m, n):
        return m.rollback(n)

    def rebuild(self, compiled, tokens):
        m = self.matcher(compiled)
        if tokens and not m.consume_tokens(tokens):
            raise ValueError(m.get_error())
        return m


# ---------------------------------------------------------------------------------------------
# xgrammar


def import_xgrammar():
    """Import xgrammar; when torch is missing, with a stand-in module so the import works.

    xgrammar's PyPI wheel declares torch (on Linux x86_64 the CUDA build, ~20 nvidia-* wheels) and
    imports it at module level, but its matcher fills any DLPack/numpy array; nothing of torch is
    used on the path measured here. The stand-in is removed from sys.modules right after import.
    """
    try:
        import xgrammar
        return xgrammar, False
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
    for k in [k for k in sys.modules if k == "xgrammar" or k.startswith("xgrammar.")]:
        del sys.modules[k]
    import transformers  # noqa: F401  (must see the real absence of torch, as must tvm_ffi)
    import tvm_ffi  # noqa: F401
    stub = types.ModuleType("torch")
    stub.int32, stub.bool, stub.float32 = np.int32, np.bool_, np.float32
    stub.Tensor = type("Tensor", (), {})
    stub.tensor = lambda v, dtype=None: np.asarray(v, dtype=dtype)
    stub.full = lambda shape, fill, dtype=None: np.full(shape, np.asarray(fill), dtype=dtype)

    def _getattr(name):
        if name[:1].isupper():  # LongTensor, FloatTensor, ... in annotations
            return type(name, (stub.Tensor,), {})
        raise AttributeError(f"torch stand-in: torch.{name} is not available")
    stub.__getattr__ = _getattr
    sys.modules["torch"] = stub
    try:
        import xgrammar
    finally:
        del sys.modules["torch"]
    return xgrammar, True


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: list[int], threads: int = 2):
        self.xgr, self.torch_stub = import_xgrammar()
        xgr = self.xgr
        tj = json.loads(tokenizer_json)
        strings, special = vocab_strings(tj, vocab_size)
        # Special added tokens as "" so xgrammar treats them as special (never allowed as text).
        # Given their literal text ("<|im_start|>"), xgrammar allows them inside JSON strings.
        strings = ["" if i in special and i not in eos_ids else s for i, s in enumerate(strings)]
        vt = xgr.VocabType.BYTE_LEVEL if is_byte_level(tj) else xgr.VocabType.RAW
        self.info = xgr.TokenizerInfo(strings, vt, vocab_size=vocab_size, stop_token_ids=list(eos_ids),
                                      add_prefix_space=False)
        # No cache: compile times are measured cold. A server would keep cache_enabled=True.
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=threads, cache_enabled=False)
        self.version = _dist_version("xgrammar") + (" (torch stand-in)" if self.torch_stub else "")

    def grammar(self, spec: Spec):
        xgr = self.xgr
        sep = (ITEM_SEP, KEY_SEP)
        if spec.kind == "json_object":
            return xgr.Grammar.from_json_schema({"type": "object"}, any_whitespace=False, separators=sep)
        if spec.kind == "json_schema":
            return xgr.Grammar.from_json_schema(spec.schema, any_whitespace=False, separators=sep,
                                                strict_mode=True)
        call = xgr.Grammar.from_json_schema(spec.schema, any_whitespace=False, separators=sep)
        return xgr.Grammar.concat(xgr.Grammar.from_ebnf(f"root ::= {json.dumps(spec.prefix)}"), call,
                                  xgr.Grammar.from_ebnf(f"root ::= {json.dumps(spec.suffix)}"))

    def compile(self, spec: Spec):
        return self.compiler.compile_grammar(self.grammar(spec))

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m, bitmask):
        m.fill_next_token_bitmask(bitmask, 0)

    def advance(self, m, token):
        return m.accept_token(token)

    def done(self, m):
        return m.is_completed() or m.is_terminated()

    def clone(self, m):
        return m.fork()

    def rollback(self, m, n):
        m.rollback(n)
        return True

    def rebuild(self, compiled, tokens):
        m = self.matcher(compiled)
        for t in tokens:
            if not m.accept_token(t):
                raise ValueError(f"token {t} rejected")
        return m


# ---------------------------------------------------------------------------------------------
# outlines-core


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: list[int], max_rollback: int = 64):
        import outlines_core as oc
        from outlines_core.json_schema import build_regex_from_schema
        self.oc, self._regex = oc, build_regex_from_schema
        self.max_rollback = max_rollback
        tj = json.loads(tokenizer_json)
        strings, special = vocab_strings(tj, vocab_size)
        bd = byte_decoder() if is_byte_level(tj) else None
        # Vocabulary(eos_token_id, {token bytes: [ids]}): the decoded bytes of each token;
        # special tokens left out (never allowed), EOS given separately (one id only).
        vmap: dict[bytes, list[int]] = {}
        for i, s in enumerate(strings):
            if i in special or i in eos_ids or not s:
                continue
            b = bytes(bd[c] for c in s) if bd else s.encode()
            vmap.setdefault(b, []).append(i)
        self.eos = eos_ids[0]
        self.vocab = oc.Vocabulary(self.eos, vmap)
        self.version = _dist_version("outlines-core")

    def regex(self, spec: Spec) -> str:
        # whitespace_pattern "" = no free whitespace; the separators below are part of the regex.
        if spec.kind == "json_object":
            rx = self._regex(json.dumps({"type": "object"}), whitespace_pattern=" ?")
        elif spec.kind == "json_schema":
            rx = self._regex(json.dumps(spec.schema), whitespace_pattern=" ?")
        else:
            rx = (re.escape(spec.prefix) + self._regex(json.dumps(spec.schema), whitespace_pattern=" ?")
                  + re.escape(spec.suffix))
        return rx

    def compile(self, spec: Spec):
        # The whole token-level automaton is built here, up front (regular languages only:
        # json_object is a depth-limited regex, recursion is not expressible).
        return self.oc.Index(self.regex(spec), self.vocab)

    def matcher(self, compiled):
        return self.oc.Guide(compiled, max_rollback=self.max_rollback)

    def fill(self, m, bitmask):
        m.write_mask_into(bitmask.ctypes.data, bitmask.size, 4)

    def advance(self, m, token):
        try:
            m.advance(token, return_tokens=False)
            return True
        except ValueError:
            return False

    def done(self, m):
        return m.is_finished()

    def clone(self, m):
        import copy
        return copy.deepcopy(m) if hasattr(m, "__deepcopy__") else _pickle_roundtrip(m)

    def rollback(self, m, n):
        m.rollback_state(n)
        return True

    def rebuild(self, compiled, tokens):
        m = self.matcher(compiled)
        for t in tokens:
            m.advance(t, return_tokens=False)
        return m


def _pickle_roundtrip(obj):
    import pickle
    return pickle.loads(pickle.dumps(obj))


def _dist_version(name: str) -> str:
    from importlib.metadata import version
    try:
        return version(name)
    except Exception:
        return "?"


BACKENDS = {"llguidance": Llguidance, "xgrammar": Xgrammar, "outlines-core": OutlinesCore}
