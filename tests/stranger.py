"""What a stranger on the network can do to a node's peer port, in raw bytes (run it in the stranger's netns).

    replies, closed = in_netns(ns, hello_session, ip, PEER_PORT, "default", proof_key=b"wrong")

Built from msgpack and the standard library only, as an attacker would: the hello
is today's hello with the fields a newer node asks for (a nonce, then a proof made
with whatever key the stranger has), so the same test runs against any build.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import time

import msgpack

MAGIC = b"SWRM"
PREFIX = struct.Struct(">II")


def frame(header: dict, payload: bytes = b"") -> bytes:
    packed = msgpack.packb(header, use_bin_type=True)
    return PREFIX.pack(len(packed), len(payload)) + packed + payload


def hello(node_id: str, swarm: str, version: int, *, nonce: bytes | None = None, purpose: str = "data") -> bytes:
    header = {"t": "hello", "v": version, "node_id": node_id, "swarm": swarm, "purpose": purpose}
    if nonce is not None:
        header["nonce"] = nonce
    return frame(header)


class FrameReader:
    """Plain frames off a blocking socket; stops at the first bytes that are not one (sealed ones)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf, self.closed = sock, b"", False

    def read(self, wait: float, until=lambda headers: False) -> list[dict]:
        """Headers of the frames that arrive within `wait` s (or until the peer closes, or `until` says so)."""
        headers: list[dict] = []
        deadline = time.monotonic() + wait
        while not self.closed and not until(headers):
            headers += self._parse()
            if until(headers):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except (socket.timeout, TimeoutError):
                break
            except OSError:
                self.closed = True
                break
            if not data:
                self.closed = True
            self.buf += data
        return headers + self._parse()

    def _parse(self) -> list[dict]:
        out = []
        while len(self.buf) >= PREFIX.size:
            header_len, payload_len = PREFIX.unpack_from(self.buf)
            end = PREFIX.size + header_len + payload_len
            if header_len > 65536 or len(self.buf) < end:
                break
            try:
                header = msgpack.unpackb(self.buf[PREFIX.size:PREFIX.size + header_len], raw=False)
            except Exception:
                break  # not a plain frame
            if not isinstance(header, dict):
                break
            out.append(header)
            self.buf = self.buf[end:]
        return out


def hello_session(ip: str, port: int, swarm: str, version: int, *, node_id: str = "stranger-0001",
                  nonce: bool = True, proof_key: bytes | None = None, then: bytes = b"",
                  wait: float = 8.0) -> tuple[list[dict], bool]:
    """Say hello like a node; answer a proof request with an HMAC under `proof_key` (a wrong secret), or
    never; send `then`; return (the frame headers the node sent, whether it closed the connection)."""
    with socket.create_connection((ip, port), timeout=5) as sock:
        sock.sendall(MAGIC + hello(node_id, swarm, version, nonce=os.urandom(32) if nonce else None))
        reader = FrameReader(sock)
        headers = reader.read(5.0, until=lambda hs: bool(hs))
        if headers and headers[0].get("t") == "hello" and proof_key is not None:
            made_up = hmac.new(proof_key, b"client|" + repr(headers[0]).encode(), hashlib.sha256).digest()
            sock.sendall(frame({"t": "proof", "proof": made_up}))
        if then:
            try:
                sock.sendall(then)
            except OSError:
                pass
        headers += reader.read(wait)
        return headers, reader.closed


def replay(ip: str, port: int, data: bytes, wait: float = 8.0) -> tuple[list[dict], bool]:
    """Send a captured byte stream as it was; (the frame headers the node answered with, closed?)."""
    with socket.create_connection((ip, port), timeout=5) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass
        reader = FrameReader(sock)
        return reader.read(wait), reader.closed


def send_and_close(ip: str, port: int, data: bytes, wait: float = 2.0) -> None:
    with socket.create_connection((ip, port), timeout=5) as sock:
        try:
            sock.sendall(data)
            sock.settimeout(wait)
            while sock.recv(65536):
                pass
        except OSError:
            pass


def _closed(sock: socket.socket) -> bool:
    """Has the other end closed (or reset) this non-blocking socket? Reads what is left first."""
    try:
        while sock.recv(65536):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def flood(ip: str, port: int, swarm: str, version: int, count: int, seconds: float,
          sample=lambda: None) -> dict:
    """Open `count` connections, each saying a hello under a fresh node id (a node without a secret
    completes it), and hold them; `sample()` is called as it goes. Bounded: all are closed after
    `seconds`. Returns counts: opened, refused at connect, closed by the node while held."""
    socks: list[socket.socket] = []
    opened = refused = 0
    deadline = time.monotonic() + seconds
    try:
        for i in range(count):
            if time.monotonic() > deadline:
                break
            try:
                s = socket.create_connection((ip, port), timeout=2)
            except OSError:
                refused += 1
                continue
            opened += 1
            try:
                s.sendall(MAGIC + hello(f"flood-{i:05d}", swarm, version, nonce=os.urandom(32)))
            except OSError:
                pass
            s.setblocking(False)
            socks.append(s)
            if i % 100 == 0:
                sample()
        while time.monotonic() < deadline:
            sample()
            time.sleep(0.2)
        closed_by_node = sum(_closed(s) for s in socks)
        return {"opened": opened, "refused": refused, "closed_by_node": closed_by_node}
    finally:
        for s in socks:
            s.close()


def _bound_connect(ip: str, port: int, source: str, timeout: float = 2.0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((source, 0))
        s.settimeout(timeout)
        s.connect((ip, port))
    except OSError:
        s.close()
        raise
    s.setblocking(False)
    return s


OPEN_GRACE_S = 60.0  # how much longer held_connections may go on to open what it was asked to


def held_connections(targets: list[tuple[str, int]], sources: list[str], per_source: int, seconds: float,
                     first_bytes: bytes, trickle: bytes = b"", trickle_every: float = 5.0,
                     until_opened: int = 0) -> dict:
    """From every source address, hold `per_source` connections to every target for `seconds`, each having
    sent `first_bytes` (and `trickle` every `trickle_every` s); a connection the node closes is opened
    again. Goes on past `seconds` until `until_opened` connections were opened (a loaded machine connects
    slowly), at most OPEN_GRACE_S longer. Bounded in count (len(sources) * per_source * len(targets) at
    once) and time. Counts back."""
    held: dict[tuple[int, int], socket.socket] = {}
    opened = failed = closed_by_node = 0
    deadline = time.monotonic() + seconds
    next_trickle = time.monotonic() + trickle_every
    slots = [(t, s) for t in range(len(targets)) for s in range(len(sources) * per_source)]
    try:
        while time.monotonic() < deadline or (opened < until_opened and time.monotonic() < deadline + OPEN_GRACE_S):
            for slot in slots:
                if time.monotonic() > deadline and opened >= until_opened:
                    break
                sock = held.get(slot)
                if sock is not None and not _closed(sock):
                    continue
                if sock is not None:
                    closed_by_node += 1
                    sock.close()
                    del held[slot]
                target, index = slot
                try:
                    sock = _bound_connect(*targets[target], sources[index // per_source])
                    sock.send(first_bytes)
                except OSError:
                    failed += 1
                    continue
                opened += 1
                held[slot] = sock
            if trickle and time.monotonic() > next_trickle:
                next_trickle = time.monotonic() + trickle_every
                for sock in held.values():
                    try:
                        sock.send(trickle)
                    except OSError:
                        pass
            time.sleep(0.2)
        return {"opened": opened, "failed": failed, "closed_by_node": closed_by_node, "held_at_end": len(held)}
    finally:
        for sock in held.values():
            sock.close()


def half_hello(node_id: str = "half-hello", swarm: str = "default", version: int = 1) -> bytes:
    """The magic and the first half of a hello frame: a hello that never completes."""
    whole = hello(node_id, swarm, version, nonce=os.urandom(32))
    return MAGIC + whole[:len(whole) // 2]
