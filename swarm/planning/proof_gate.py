"""Who planning may count on: this node, and the peers that proved the layers they claim (event loop).

A peer says in its profile which layers it holds (`holds`); it is planned once it proved them to
this node (layer_proofs.py). Three cases plan a peer before its proof:
  * this node fetches its model from peers and no plan with it served yet (a newcomer): it plans
    the other newcomers (peers that claim no layers yet) too, so that each fetches its share of
    one plan and not of a plan without the others; a peer that claims layers proves them first;
  * a peer in our plan whose new claim waits its turn stays until a challenge fails (no plan flaps
    while a claim is checked);
  * without proofs (tests of planning alone) every claim is believed.
A node that serves from its own files is never a newcomer: a record that says it is new costs its
plans nothing.
"""

from __future__ import annotations

from discovery import Discovery
from discovery.profile import NodeProfile
from discovery.profile_keys import HOLDS_KEY
from partitioner import Plan

from ..weights.layer_proof import parse_holds
from ..weights.peer_weights import PeerWeights
from .layer_proofs import Claim, LayerProofs


class ProofGate:
    def __init__(self, node_id: str, n_layers: int, fingerprint: str, discovery: Discovery,
                 proofs: LayerProofs | None, weights: PeerWeights | None) -> None:
        self.node_id, self.n_layers, self.fingerprint = node_id, n_layers, fingerprint
        self.discovery, self.proofs, self.weights = discovery, proofs, weights

    def plannable(self, profile: NodeProfile, plan: Plan | None, before: Plan | None) -> bool:
        """May `profile`'s node be planned? (`plan`: ours now; `before`: the last plan seen whole.)"""
        if profile.node_id == self.node_id or self.proofs is None:
            return True
        if self.proofs.proven(profile.node_id, profile.instance):
            return True
        if self.proofs.refuted(profile.node_id, profile.instance):
            return False
        claim = self.claims(profile)
        if claim is None:
            return self._newcomer(before)  # a fellow newcomer
        return plan is not None and profile.node_id in {s.node_id for s in plan.stages}  # its claim waits its turn

    def _newcomer(self, before: Plan | None) -> bool:
        """Fetching the model from peers, and in no plan that served yet."""
        store = self.weights.store if self.weights is not None else None
        if store is None or not store.writable:
            return False
        return before is None or self.node_id not in {s.node_id for s in before.stages}

    def claims(self, profile: NodeProfile) -> tuple[int, int] | None:
        """The layers a node says it holds (None: it says none)."""
        return parse_holds(profile.extra.get(HOLDS_KEY), self.n_layers)

    def proven(self, profile: NodeProfile) -> bool:
        """Did this node prove its claim to us (all do where nobody checks)?"""
        return self.proofs is None or self.proofs.proven(profile.node_id, profile.instance)

    def ask_for_proofs(self) -> None:
        """Every peer that claims our model and layers of it is challenged, in time (layer_proofs.py)."""
        if self.proofs is None:
            return
        claims = []
        for p in self.discovery.view():
            holds = self.claims(p.profile)
            if p.profile.model_fingerprint == self.fingerprint and p.profile.speed > 0 and holds is not None:
                claims.append(Claim(p.node_id, p.profile.instance, holds))
        self.proofs.consider(claims)

    async def claim_held(self, layers: tuple[int, int] | None) -> None:
        """Say which layers this node holds (what its peers challenge it over before they plan it): all of
        them from the user's own model directory; else the layers just fetched, with those held before
        where the two meet."""
        store = self.weights.store if self.weights is not None else None
        if store is not None and not store.writable:
            holds = (0, self.n_layers)
        elif layers is None:
            return
        else:
            now = self.claims(self.discovery.profile)
            if now is not None and now[0] <= layers[0] and layers[1] <= now[1]:
                return
            meet = now is not None and layers[0] <= now[1] and now[0] <= layers[1]
            holds = (min(now[0], layers[0]), max(now[1], layers[1])) if meet else layers
        await self.discovery.update_profile(extra={HOLDS_KEY: f"{holds[0]}-{holds[1]}"})
