"""What a node measured of its links to its peers, as its profile carries them (`NodeProfile.links`).

peer node id -> (round-trip seconds, bytes per second; 0.0 when unknown). Every node plans from the
same view, so what a node advertises is quantized on a log scale (a round trip to a third of an octave,
a bandwidth to a half octave) and bounded (MAX_LINKS peers, MAX_TXT_BYTES in the TXT record); the
node that measures keeps noise out of it (swarm/node/link_meter.py). A value is snapped to its grid
wherever a profile is built, so both encodings round-trip exactly:

- JSON: {"peer": [rtt_s, bytes_per_s], ...}
- TXT: entries "lk0", "lk1", ..., each a comma-separated list of <rtt code><bandwidth code><peer id>,
  one character per code (CODE_CHARS), as many entries as it takes (each under 255 bytes).

Pure: no I/O.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

MAX_LINKS = 64
MAX_TXT_BYTES = 1300  # all links entries together: 64 peers of 16-hex-digit ids fit
MAX_PEER_ID_CHARS = 64
TXT_KEY_PREFIX = "lk"
CODE_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_"  # 64 codes, one char each
_CODE_OF = {c: i for i, c in enumerate(CODE_CHARS)}

# Round trip: code k is 2**(k/3) times 10 microseconds, 10 us .. 21 s.
RTT_STEPS_PER_OCTAVE = 3
RTT_UNIT_S = 1e-5
MAX_RTT_S = 2 ** (63 / RTT_STEPS_PER_OCTAVE) * RTT_UNIT_S
# Bandwidth: code 0 is unknown, code j >= 1 is 2**(10 + j/2) bytes/s, 1.4 kB/s .. 3 TB/s.
BW_STEPS_PER_OCTAVE = 2
BW_BASE_OCTAVE = 10
MAX_BW = 2 ** (BW_BASE_OCTAVE + 63 / BW_STEPS_PER_OCTAVE)

Links = Mapping[str, tuple[float, float]]


class BadLinks(ValueError):
    """A links field that is not a valid one (the profile that carries it is refused)."""


def rtt_code(rtt_s: float) -> int:
    return min(63, max(0, round(RTT_STEPS_PER_OCTAVE * math.log2(rtt_s / RTT_UNIT_S)))) if rtt_s > 0 else 0


def rtt_of(code: int) -> float:
    return 2 ** (code / RTT_STEPS_PER_OCTAVE) * RTT_UNIT_S


def bw_code(bytes_per_s: float) -> int:
    if bytes_per_s <= 0:
        return 0
    return min(63, max(1, round(BW_STEPS_PER_OCTAVE * (math.log2(bytes_per_s) - BW_BASE_OCTAVE))))


def bw_of(code: int) -> float:
    return 0.0 if code == 0 else 2 ** (BW_BASE_OCTAVE + code / BW_STEPS_PER_OCTAVE)


def quantize(rtt_s: float, bytes_per_s: float) -> tuple[float, float]:
    """The values on the advertised grid nearest to these (in range: see `checked`)."""
    return rtt_of(rtt_code(rtt_s)), bw_of(bw_code(bytes_per_s))


def is_listable(peer: Any) -> bool:
    """Whether a peer id can be listed: 1-64 printable ASCII characters, no comma or space."""
    return (isinstance(peer, str) and 0 < len(peer) <= MAX_PEER_ID_CHARS
            and all(33 <= ord(c) <= 126 and c != "," for c in peer))


def checked(links: Any, own_id: str) -> dict[str, tuple[float, float]]:
    """`links` snapped to the grid, sorted by peer; BadLinks names what is wrong (a lying or malformed
    value: not a number, not finite, a round trip <= 0 or over MAX_RTT_S, a negative bandwidth, the
    node itself, too many peers, an id that cannot be listed)."""
    if not isinstance(links, Mapping):
        raise BadLinks(f"links must be an object, got {type(links).__name__}")
    if len(links) > MAX_LINKS:
        raise BadLinks(f"links name {len(links)} peers (at most {MAX_LINKS})")
    out = {}
    for peer, value in links.items():
        if not is_listable(peer):
            raise BadLinks(f"links: peer id {str(peer)[:80]!r} is not 1-{MAX_PEER_ID_CHARS} printable "
                           f"characters without ',' or space")
        if peer == own_id:
            raise BadLinks(f"links: a node has no link to itself ({peer!r})")
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise BadLinks(f"links[{peer!r}] must be [round-trip seconds, bytes per second]")
        rtt, bw = value
        if isinstance(rtt, bool) or isinstance(bw, bool) or not all(isinstance(v, (int, float)) for v in value):
            raise BadLinks(f"links[{peer!r}] must be two numbers")
        if not (math.isfinite(rtt) and 0 < rtt <= MAX_RTT_S * 1.1):
            raise BadLinks(f"links[{peer!r}]: round trip {rtt!r} s must be finite, > 0 and <= {MAX_RTT_S:.0f}")
        if not (math.isfinite(bw) and 0 <= bw <= MAX_BW * 1.5):
            raise BadLinks(f"links[{peer!r}]: bandwidth {bw!r} B/s must be finite, >= 0 and <= {MAX_BW:.3g}")
        out[peer] = quantize(float(rtt), float(bw))
    size = sum(len(e) + len(TXT_KEY_PREFIX) + 2 for _, e in _txt_entries(out))
    if size > MAX_TXT_BYTES:
        raise BadLinks(f"links take {size} bytes in the TXT record (at most {MAX_TXT_BYTES}): fewer peers")
    return dict(sorted(out.items()))


def encoded_size(peer: str) -> int:
    """Bytes one peer's link takes in the TXT record (its codes, its id, a separator)."""
    return len(peer) + 3


def to_json(links: Links) -> dict[str, list[float]]:
    return {peer: [rtt, bw] for peer, (rtt, bw) in links.items()}


def from_json(value: Any) -> dict[str, Any]:
    """The JSON form as `checked` takes it (BadLinks if it is not an object)."""
    if not isinstance(value, Mapping):
        raise BadLinks(f"links must be an object, got {type(value).__name__}")
    return dict(value)


def _txt_entries(links: Links, max_entry: int = 254) -> list[tuple[str, str]]:
    """(key, value) TXT entries: items packed greedily, each entry within `max_entry` bytes."""
    entries: list[list[str]] = []
    room = max_entry - len(TXT_KEY_PREFIX) - 3  # "lkNN=" (an index of up to two digits)
    used = 0
    for peer, (rtt, bw) in sorted(links.items()):
        item = CODE_CHARS[rtt_code(rtt)] + CODE_CHARS[bw_code(bw)] + peer
        if not entries or used + 1 + len(item) > room:
            entries.append([])
            used = -1
        entries[-1].append(item)
        used += 1 + len(item)
    return [(f"{TXT_KEY_PREFIX}{i}", ",".join(items)) for i, items in enumerate(entries)]


def to_txt(links: Links) -> list[tuple[str, str]]:
    return _txt_entries(links)


def is_txt_key(key: str) -> bool:
    return key.startswith(TXT_KEY_PREFIX) and key[len(TXT_KEY_PREFIX):].isdigit()


def from_txt(entries: Mapping[str, str]) -> dict[str, tuple[float, float]]:
    """The links of TXT entries {"lk0": ..., ...} (not yet `checked`); BadLinks if garbled."""
    links: dict[str, tuple[float, float]] = {}
    for key in sorted(entries, key=lambda k: int(k[len(TXT_KEY_PREFIX):])):
        for item in entries[key].split(",") if entries[key] else []:
            if len(item) < 3 or item[0] not in _CODE_OF or item[1] not in _CODE_OF:
                raise BadLinks(f"links entry {key}: item {item[:80]!r} is not <rtt code><bandwidth code><peer>")
            peer = item[2:]
            if peer in links:
                raise BadLinks(f"links entry {key}: peer {peer[:80]!r} listed twice")
            rtt_c = _CODE_OF[item[0]]
            links[peer] = (rtt_of(rtt_c), bw_of(_CODE_OF[item[1]]))
    return links
