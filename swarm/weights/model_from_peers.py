"""A node that does not hold its model learns it from the peers that serve it (event loop).

It waits until some peer in its view names the model (`--model ID`), or any model
at all (`--join`), takes the fingerprint most such peers name, gets the manifest
from one of them (accepted only if it hashes to that fingerprint), and fetches the
small files every node needs: configs, tokenizer, the weight files' headers. That
is enough to plan with: the node then measures its speed on the model's own layer
shapes and takes part in planning; each stage's tensors come later, when a plan
gives it layers (peer_weights.py).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Awaitable, Callable

from discovery import Discovery, NodeState

from ..transport.errors import ProtocolError
from ..models.manifest import Manifest, ManifestError
from .peer_weights import NotEnoughDisk, PeerWeights, fetched_model_dir
from .store import ChunkStore
from .transfer import FetchStuck, OpenLink, fetch_manifest

log = logging.getLogger(__name__)

LOOK_EVERY_S = 1.0
RETRY_S = 5.0

Report = Callable[[str, NodeState], Awaitable[None]]  # (what the node waits for, in one line; its state)


def holders_of(discovery: Discovery, model_id: str | None) -> dict[tuple[str, str], list[str]]:
    """(model id, fingerprint) -> peers that serve it, among the peers in the view."""
    found: dict[tuple[str, str], list[str]] = {}
    for peer in discovery.view():
        p = peer.profile
        if p.model_fingerprint and (model_id is None or p.model_id == model_id):
            found.setdefault((p.model_id, p.model_fingerprint), []).append(peer.node_id)
    return found


def peers_in_view(discovery: Discovery) -> str:
    """The peers this node sees, each with the model it serves (for a line saying what we wait for)."""
    peers = [f"{p.profile.name or p.node_id[:8]} ({p.profile.model_id or 'no model yet'})" for p in discovery.view()]
    return ", ".join(sorted(peers)) or "none"


async def model_files_from_peers(model_id: str | None, discovery: Discovery, open_link: OpenLink,
                                 models_root: Path, weights: PeerWeights, report: Report,
                                 not_here: str = "", swarm: str = "") -> tuple[str, Manifest]:
    """(model id, manifest) once the model's small files are on disk; `weights` holds its store.
    `not_here`: where this machine looked for the model (said in the line about waiting);
    `swarm`: the swarm whose peers it waits for."""
    said = None
    scope = f" of swarm {swarm!r}" if swarm else ""
    while True:
        found = holders_of(discovery, model_id)
        if not found:
            why = (f"{not_here + '; ' if not_here else ''}no peer{scope} holds {model_id!r}: waiting for one"
                   if model_id else f"no peer{scope} serves a model yet: waiting for one to join")
            seen = f"{why} (peers in view: {peers_in_view(discovery)})"
            if seen != said:
                log.warning("%s", seen)
                said = seen
                weights.status.state, weights.status.error = "looking", why
                await report(why, NodeState.LOOKING)
            await asyncio.sleep(LOOK_EVERY_S)
            continue
        (chosen_id, fingerprint), holders = max(found.items(), key=lambda kv: (len(kv[1]), kv[0]))
        if len(found) > 1:
            log.warning("peers serve %d versions of %s; taking %s, which %d of them serve", len(found),
                        model_id or "the swarm's model", fingerprint, len(holders))
        manifest, error = await _manifest_from_any(holders, fingerprint, open_link)
        if manifest is None:
            mismatch = isinstance(error, ManifestError)
            why = (f"no peer gives a manifest of {chosen_id} that matches its fingerprint {fingerprint} "
                   f"({error}): waiting for one that does" if mismatch else
                   f"no peer holding {chosen_id} answers ({error}): trying again")
            if why != said:
                log.warning("%s", why)
                said = why
                state = NodeState.MISMATCH if mismatch else NodeState.LOOKING
                weights.status.state, weights.status.error = state.value, why
                await report(why, state)
            await asyncio.sleep(LOOK_EVERY_S)
            continue
        weights.hold(ChunkStore.partial(fetched_model_dir(models_root, chosen_id, fingerprint), manifest))
        await report(f"fetching the configuration and tokenizer of {chosen_id}", NodeState.FETCHING)
        try:
            await weights.fetch(manifest.support_chunks(), f"the configuration and tokenizer of {chosen_id}")
        except (NotEnoughDisk, FetchStuck) as e:
            log.warning("cannot fetch the model's small files yet: %s; trying again in %.0f s", e, RETRY_S)
            await report(str(e), NodeState.NO_DISK if isinstance(e, NotEnoughDisk) else NodeState.STUCK)
            await asyncio.sleep(RETRY_S)
            continue
        return chosen_id, manifest


async def _manifest_from_any(holders: list[str], fingerprint: str,
                             open_link: OpenLink) -> tuple[Manifest | None, Exception | None]:
    """The first manifest a holder gives that hashes to `fingerprint`, else the last reason none did."""
    error: Exception | None = None
    for holder in holders:
        link = None
        try:
            link = await open_link(holder)
            return await fetch_manifest(link, fingerprint), None
        except (OSError, ProtocolError, ManifestError, asyncio.TimeoutError) as e:
            log.debug("no manifest of %s from %s: %s", fingerprint, holder, e)
            error = e if not isinstance(error, ManifestError) else error  # a mismatch is the news
        finally:
            if link is not None:
                await link.close()
    return None, error
