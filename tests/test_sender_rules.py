"""Who may send a node what (node/sender_rules.py), rule by rule, on real plans and messages."""

from __future__ import annotations

from partitioner import ModelSpec, Plan, Stage

from swarm.engine.sampling import SamplingParams
from swarm.entry.own_requests import OwnRequests
from swarm.node.sender_rules import LATE, SenderRules
from swarm.transport.messages import Error, Forward, Token

PLAN = Plan(ModelSpec(6, 1000), "balanced", (Stage("a", 0, 2), Stage("b", 2, 4), Stage("c", 4, 6)), (), 0.0, "p1")
GREEDY = SamplingParams()


def rules(node_id: str, members=("a", "b", "c", "e"), own: OwnRequests | None = None) -> SenderRules:
    plans = {PLAN.plan_id: PLAN}
    return SenderRules(node_id, plans.get, lambda n: n in members, own or OwnRequests(), vocab=100)


def into(start: int, entry: str = "e", plan: str = "p1") -> Forward:
    if start == 0:
        return Forward.of_tokens("r1", plan, 0, entry, GREEDY, [1, 2])
    return Forward("r1", plan, 0, start, entry, GREEDY, "float32", (1, 2, 4), bytes(32))


def test_stage_0_takes_a_requests_tokens_from_its_entry_only():
    a = rules("a")
    assert a.mlx_forward("e", into(0, entry="e")) is None
    assert a.mlx_forward("a", into(0, entry="a")) is None  # the entry is stage 0 itself
    assert "from its entry" in a.mlx_forward("x", into(0, entry="e"))  # someone else naming the entry
    assert "not in this node's view" in a.mlx_forward("x", into(0, entry="x"))  # a stranger as its own entry
    assert rules("a", members=("x",)).mlx_forward("x", into(0, entry="x")) is None  # a member may be an entry


def test_a_later_stage_takes_input_from_the_stage_before_it_only():
    assert rules("b").mlx_forward("a", into(2)) is None
    assert rules("c").mlx_forward("b", into(4)) is None
    assert "from node a only" in rules("b").mlx_forward("e", into(2))  # the entry cannot skip stage 0
    assert "from node b only" in rules("c").mlx_forward("a", into(4))


def test_a_forward_for_another_plan_layer_or_node_is_refused():
    assert "not one this node was given" in rules("b").mlx_forward("a", into(2, plan="p2"))
    assert "starts at layer 3" in rules("b").mlx_forward("a", into(3))
    assert "is node c's" in rules("b").mlx_forward("b", into(4))


def test_tokens_come_from_the_last_stage_errors_from_any_stage_for_own_requests_only():
    own = OwnRequests()
    e = rules("e", own=own)
    token, error = Token("r1", "p1", 5, 7), Error("r1", "p1", "cache", "lost")
    assert e.mlx_answer("c", token) is LATE and e.mlx_answer("c", error) is LATE  # not a request of ours
    own.begin("r1", PLAN)
    assert e.mlx_answer("c", token) is None
    assert "last stage (c)" in e.mlx_answer("b", token)
    assert "last stage" in e.mlx_answer("x", token)
    assert all(e.mlx_answer(s, error) is None for s in ("a", "b", "c", "e"))  # "e": our own send failed
    assert "a stage of plan p1" in e.mlx_answer("x", error)
    assert e.mlx_answer("c", Token("r1", "p0", 5, 7)) is LATE  # from a plan the request has left
    own.end("r1")
    assert e.mlx_answer("c", token) is LATE


def test_a_token_outside_the_vocabulary_is_the_last_stages_fault():
    e = rules("e")
    assert e.mlx_token_problem(Token("r1", "p1", 5, 99)) is None
    assert "outside the vocabulary" in e.mlx_token_problem(Token("r1", "p1", 5, 100))
