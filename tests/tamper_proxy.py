"""A man in the middle for tests: TCP relays that record what passes and can alter one frame.

    python tests/tamper_proxy.py --record DIR LISTEN_IP:PORT=TARGET_IP:PORT ...

Run on a test host of its own (a netns): each mapping relays connections made to
LISTEN to TARGET, both ways. Every connection's client -> server bytes are written,
as they came and before any change, to DIR/conn-<n>.bin. stdin takes JSON commands:
{"tamper": [LO, HI]}: the next read client -> server of LO to HI bytes on a data
connection (one whose hello names no purpose, or "data"): XOR its last 256 bytes,
once (a frame carrying one position's hidden states: all of them).
{"tamper": [LO, HI], "between": [IP_A, IP_B]}: the same, in either direction, on a
data connection between those two hosts only (whichever of them dialed). stdout says, as JSON lines: "ready", "open"/"close" of each
connection (with its purpose; a close with the bytes it carried both ways), and "tampered". A connection reset on one side is
passed on as a reset on the other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import sys
from pathlib import Path

import msgpack

PREFIX = struct.Struct(">II")


def say(**event) -> None:
    sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
    sys.stdout.flush()


def purpose_of(first: bytes) -> str | None:
    """The hello's purpose from a connection's first bytes (None while incomplete)."""
    if first[:4] != b"SWRM":
        return "other" if len(first) >= 4 else None
    if len(first) < 4 + PREFIX.size:
        return None
    header_len, _ = PREFIX.unpack_from(first, 4)
    if len(first) < 4 + PREFIX.size + header_len:
        return None
    try:
        header = msgpack.unpackb(first[4 + PREFIX.size:4 + PREFIX.size + header_len], raw=False)
        return str(header.get("purpose") or "data")
    except Exception:
        return "other"


class Relay:
    def __init__(self, record: Path) -> None:
        self.record, self.count = record, 0
        self.tamper: tuple[int, int, frozenset[str] | None] | None = None

    async def follow_commands(self) -> None:
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command = json.loads(line)
            if "tamper" in command:
                lo, hi = command["tamper"]
                between = frozenset(command["between"]) if command.get("between") else None
                self.tamper = (int(lo), int(hi), between)

    def handler(self, target: tuple[str, int]):
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.count += 1
            n = self.count
            try:
                up_reader, up_writer = await asyncio.open_connection(*target)
            except OSError:
                _reset(writer)
                return
            client = (writer.get_extra_info("peername") or ("?",))[0]
            state = {"purpose": None, "first": b"", "ends": frozenset({client, target[0]}), "bytes": 0}
            with open(self.record / f"conn-{n}.bin", "wb") as rec:
                await asyncio.gather(self.pump(reader, up_writer, n, target, state, rec),
                                     self.pump(up_reader, writer, n, target, None, None, state, client))
        return handle

    async def pump(self, reader, writer, n, target, state, rec, down_state=None, client=None) -> None:
        """One direction; `state` and `rec` for client -> server, `down_state` (the same) server -> client."""
        reset = False
        try:
            while data := await reader.read(256 * 1024):
                if state is not None:
                    rec.write(data)
                    rec.flush()
                    if state["purpose"] is None:
                        state["first"] += data
                        state["purpose"] = purpose_of(state["first"])
                        if state["purpose"] is not None:
                            say(event="open", conn=n, target=f"{target[0]}:{target[1]}", purpose=state["purpose"])
                (state or down_state)["bytes"] += len(data)
                going_to = target[0] if state is not None else client
                if self._tampers(state or down_state, len(data), upstream=state is not None):
                    cut = len(data) - 256
                    data = data[:cut] + bytes(b ^ 0x5A for b in data[cut:])
                    self.tamper = None
                    say(event="tampered", conn=n, target=f"{target[0]}:{target[1]}", to=going_to, read=len(data))
                writer.write(data)
                await writer.drain()
        except (ConnectionResetError, BrokenPipeError):
            reset = True
        except OSError:
            reset = True
        finally:
            if state is not None:
                say(event="close", conn=n, purpose=state["purpose"], reset=reset, bytes=state["bytes"])
            if reset:
                _reset(writer)
            else:
                try:
                    writer.write_eof()
                except OSError:
                    pass


    def _tampers(self, state: dict, size: int, upstream: bool) -> bool:
        if self.tamper is None or state["purpose"] != "data":
            return False
        lo, hi, between = self.tamper
        if not lo <= size <= hi:
            return False
        return upstream if between is None else between == state["ends"]


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


async def main(args: argparse.Namespace) -> None:
    relay = Relay(Path(args.record))
    servers = []
    for mapping in args.mappings:
        listen, _, target = mapping.partition("=")
        lhost, _, lport = listen.rpartition(":")
        thost, _, tport = target.rpartition(":")
        servers.append(await asyncio.start_server(relay.handler((thost, int(tport))), lhost, int(lport)))
    say(event="ready")
    commands = asyncio.create_task(relay.follow_commands())
    await asyncio.sleep(args.seconds)
    commands.cancel()
    for server in servers:
        server.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--record", required=True)
    p.add_argument("--seconds", type=float, default=600, help="stop by itself after this long")
    p.add_argument("mappings", nargs="+", metavar="LISTEN_IP:PORT=TARGET_IP:PORT")
    asyncio.run(main(p.parse_args()))
