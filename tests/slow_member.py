"""A real `swarm-node` whose data lane can be made to read slowly: a slow member of the swarm.

    SLOW_MEMBER_MODE=/path/to/file python tests/slow_member.py <swarm-node arguments>

Everything is the real node: it loads its layers, announces the plans it serves, answers profile
requests and liveness probes on the event loop, and completes every hello. Only the frames its
peers send on the data lane (transport/connection.py's reader, on the MLX thread) are read as the
file says, checked before every read:

  (empty or absent)   as usual
  stall               nothing is read any more (the bytes wait in the kernel's buffers)
  trickle             64 bytes a second per connection

what a member with a stuck MLX thread, a saturated link or an insider out to stop the swarm looks
like to its peers. For tests in network namespaces only (swarm_cluster.py starts it).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.transport import connection  # noqa: E402

MODE_FILE = Path(os.environ["SLOW_MEMBER_MODE"])
TRICKLE_BYTES, TRICKLE_EVERY_S = 64, 1.0
NAP_S = 0.1  # a slow read returns after this, so the node's other work still runs between reads

_read_frames = connection.PeerConnection.read_frames
_next_read: dict[int, float] = {}


def _mode() -> str:
    try:
        return MODE_FILE.read_text().strip()
    except FileNotFoundError:
        return ""


def read_frames_as_told(self: connection.PeerConnection):
    mode = _mode()
    if not mode or self.has_pending:
        return _read_frames(self)
    if mode == "stall":
        time.sleep(NAP_S)  # the socket stays readable: the MLX thread comes back here
        return []
    now, key = time.monotonic(), id(self)
    due = _next_read.get(key, now)
    if now < due:
        time.sleep(min(NAP_S, due - now))
        return []
    _next_read[key] = now + TRICKLE_EVERY_S
    if self._recv_buf is None:
        self._recv_buf = bytearray(connection.RECV_BYTES)
    try:
        n = self.sock.recv_into(self._recv_buf, TRICKLE_BYTES)
    except (BlockingIOError, InterruptedError):
        return []
    if n == 0:
        return None if not self._parser.mid_frame else _read_frames(self)
    self.last_active = time.monotonic()
    return self._parser.feed(memoryview(self._recv_buf)[:n])


connection.PeerConnection.read_frames = read_frames_as_told

if __name__ == "__main__":
    from swarm.cli import main
    sys.exit(main(sys.argv[1:]))
