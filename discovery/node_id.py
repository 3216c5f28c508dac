"""Stable, unique node ids.

An id is kept in `<state_dir>/node_id` (JSON) together with where it was
minted: the host's machine id, the state dir's realpath and the state dir's
(device, inode). The stored id is reused only when all three still match, so
  * a restart of the same node keeps its id;
  * a state dir copied to another path or another machine mints a new id
    (a copy has a new inode/realpath; another host has another machine id);
  * two nodes on one host with their own state dirs get different ids.
Moving a state dir also mints a new id: when in doubt we re-mint, because a
spurious new id costs little and a shared id breaks the swarm.

What the file check cannot see (e.g. two processes pointed at the very same
state dir, or cloned VMs with identical machine ids and paths) is caught at
runtime: a peer announcing our id from another endpoint is a conflict, and the
later-started of the two (by `started_at`, ties by `instance`) re-mints; see
`must_remint` and Discovery.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import uuid
from pathlib import Path

from .profile import NodeProfile

log = logging.getLogger(__name__)

NODE_ID_FILE = "node_id"
_MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def machine_id() -> str:
    """An id of this host that survives reboots (falls back to MAC + hostname)."""
    for path in _MACHINE_ID_FILES:
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value:
            return value
    return f"{uuid.getnode():012x}-{socket.gethostname()}"


def mint_node_id() -> str:
    return secrets.token_hex(8)


def new_instance_nonce() -> str:
    return secrets.token_hex(6)


def _origin(state_dir: Path, host_id: str) -> dict[str, object]:
    st = state_dir.stat()
    return {"machine_id": host_id, "state_dir": str(state_dir.resolve()), "inode": [st.st_dev, st.st_ino]}


def _write(state_dir: Path, node_id: str, host_id: str) -> None:
    record = {"node_id": node_id, **_origin(state_dir, host_id)}
    tmp = state_dir / f".{NODE_ID_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, state_dir / NODE_ID_FILE)  # atomic: a reader never sees half a file


def load_or_mint_node_id(state_dir: str | os.PathLike[str], host_id: str | None = None) -> str:
    """The node id for `state_dir`, minting and storing a new one when needed."""
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    host_id = host_id or machine_id()
    try:
        record = json.loads((state / NODE_ID_FILE).read_text())
        stored_id = record["node_id"]
        stored_origin = {k: record.get(k) for k in ("machine_id", "state_dir", "inode")}
    except FileNotFoundError:
        stored_id = None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("unreadable %s (%s); minting a new node id", state / NODE_ID_FILE, exc)
        stored_id = None
    if stored_id and isinstance(stored_id, str) and stored_origin == _origin(state, host_id):
        return stored_id
    if stored_id:
        log.warning("state dir %s was copied or moved (node id %s was minted elsewhere); minting a new node id",
                    state, stored_id)
    node_id = mint_node_id()
    _write(state, node_id, host_id)
    return node_id


def remint_node_id(state_dir: str | os.PathLike[str] | None, host_id: str | None = None) -> str:
    """Mint a new id after a runtime conflict, persisting it when there is a state dir."""
    node_id = mint_node_id()
    if state_dir is not None:
        state = Path(state_dir)
        state.mkdir(parents=True, exist_ok=True)
        _write(state, node_id, host_id or machine_id())
    return node_id


def must_remint(own: NodeProfile, other: NodeProfile) -> bool:
    """Whether `own` must take a new id because `other` (another instance) holds it.

    Both sides evaluate the same rule, so exactly one of them re-mints: the one
    that started later (ties broken by instance nonce).
    """
    if own.node_id != other.node_id or own.instance == other.instance:
        return False
    return (own.started_at, own.instance) > (other.started_at, other.instance)
