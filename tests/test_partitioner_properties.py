"""Property tests for the partitioner over random swarms.

The brute force searches the same space `balanced` documents: every subset
of the nodes in every order, every split into contiguous non-empty stages.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations, permutations
from typing import Optional

from hypothesis import given, settings
from hypothesis import strategies as st

from partitioner import InsufficientMemoryError, ModelSpec, NodeCapacity, Plan, make_plan

FAST = settings(max_examples=150, deadline=None)
SPEEDS = [0.5, 1.0, 1.0, 1.5, 2.0, 3.0, 0.1, 0.3]  # repeats make ties likely
HOPS = [0.0, 0.0, 0.25, 1.0, 3.0]


@st.composite
def models(draw, max_layers: int = 8) -> ModelSpec:
    """Uniform layers, or each layer its own weights and cache reserve (mixed models)."""
    n = draw(st.integers(1, max_layers))
    per_layer = draw(st.booleans())
    return ModelSpec(
        n_layers=n,
        bytes_per_layer=draw(st.integers(1, 10)),
        embedding_bytes=draw(st.integers(0, 10)),
        head_bytes=draw(st.integers(0, 10)),
        kv_bytes_per_token_per_layer=draw(st.integers(0, 2)),
        context_tokens=draw(st.integers(0, 3)),
        layer_weight_bytes=tuple(draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))) if per_layer else (),
        layer_kv_bytes=tuple(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)))
        if per_layer and draw(st.booleans()) else (),
    )


@st.composite
def swarms(draw, max_nodes: int = 4, max_memory: int = 100, hops: bool = True) -> list[NodeCapacity]:
    ids = draw(st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=max_nodes, unique=True))
    return [
        NodeCapacity(
            node_id,
            memory_bytes=draw(st.integers(0, max_memory)),
            seconds_per_layer=draw(st.sampled_from(SPEEDS)),
            hop_latency_s=draw(st.sampled_from(HOPS)) if hops else 0.0,
        )
        for node_id in ids
    ]


def plan_or_none(model: ModelSpec, nodes: list[NodeCapacity], strategy: str) -> Optional[Plan]:
    try:
        return make_plan(model, nodes, strategy)
    except InsufficientMemoryError:
        return None


def stage_time(node: NodeCapacity, n_layers: int, n_stages: int) -> Fraction:
    hop = Fraction(node.hop_latency_s) if n_stages > 1 else 0
    return n_layers * Fraction(node.seconds_per_layer) + hop


def ideal_shares(model: ModelSpec, nodes: list[NodeCapacity]) -> dict[str, Fraction]:
    """Speed-proportional layer counts over the nodes that can hold a layer."""
    usable = [n for n in nodes if n.memory_bytes >= model.layer_bytes]
    rate = {n.node_id: 1 / Fraction(n.seconds_per_layer) for n in usable}
    return {k: model.n_layers * r / sum(rate.values()) for k, r in rate.items()}


def brute_force(model: ModelSpec, nodes: list[NodeCapacity]) -> Optional[tuple[Fraction, ...]]:
    """Least (bottleneck, deviation from ideal, total time) over all orders, subsets
    and splits; None if nothing fits."""
    n, best, ideal = model.n_layers, None, ideal_shares(model, nodes)
    for k in range(1, min(len(nodes), n) + 1):
        for cuts in combinations(range(1, n), k - 1):
            sizes = [b - a for a, b in zip((0, *cuts), (*cuts, n))]
            for order in permutations(nodes, k):
                fits = all(
                    model.stage_bytes(x, i == 0, i == k - 1) <= node.memory_bytes
                    for i, (node, x) in enumerate(zip(order, sizes))
                )
                if fits:
                    times = [stage_time(node, x, k) for node, x in zip(order, sizes)]
                    layers = {node.node_id: x for node, x in zip(order, sizes)}
                    deviation = sum(abs(layers.get(i, 0) - r) for i, r in ideal.items())
                    key = (max(times), deviation, sum(times))
                    best = key if best is None or key < best else best
    return best


def assert_well_formed(plan: Plan, model: ModelSpec, nodes: list[NodeCapacity]) -> None:
    by_id = {node.node_id: node for node in nodes}
    # Contiguous exact cover of [0, n_layers), no empty stage, no node twice.
    assert plan.stages[0].start == 0 and plan.stages[-1].end == model.n_layers
    for before, after in zip(plan.stages, plan.stages[1:]):
        assert before.end == after.start
    assert all(s.n_layers >= 1 for s in plan.stages)
    layers = [layer for s in plan.stages for layer in range(s.start, s.end)]
    assert layers == list(range(model.n_layers))
    stage_ids = [s.node_id for s in plan.stages]
    idle_ids = [i.node_id for i in plan.idle]
    assert len(set(stage_ids)) == len(stage_ids)
    assert sorted(stage_ids + idle_ids) == sorted(by_id)
    # No node over its memory, counting the extras of the first and last stage: neither
    # what its range holds nor the heaviest run of as many layers (what it was planned with).
    last = len(plan.stages) - 1
    for i, s in enumerate(plan.stages):
        assert model.range_bytes(s.start, s.end, i == 0, i == last) <= model.stage_bytes(s.n_layers, i == 0, i == last)
        assert model.stage_bytes(s.n_layers, i == 0, i == last) <= by_id[s.node_id].memory_bytes
    # The reported bottleneck is the slowest stage under the documented timing rule.
    times = [stage_time(by_id[s.node_id], s.n_layers, len(plan.stages)) for s in plan.stages]
    assert plan.bottleneck_s == float(max(times))


@FAST
@given(models(), swarms(), st.sampled_from(["balanced", "memory"]))
def test_plan_is_a_contiguous_cover_within_memory(model, nodes, strategy):
    plan = plan_or_none(model, nodes, strategy)
    if plan is not None:
        assert_well_formed(plan, model, nodes)


@settings(max_examples=60, deadline=None)
@given(models(max_layers=40), swarms(max_nodes=8, max_memory=400), st.sampled_from(["balanced", "memory"]))
def test_uneven_layer_counts_on_bigger_swarms_never_drop_or_duplicate_a_layer(model, nodes, strategy):
    plan = plan_or_none(model, nodes, strategy)
    if plan is not None:
        assert_well_formed(plan, model, nodes)


@FAST
@given(models(), swarms(), st.sampled_from(["balanced", "memory"]), st.randoms(use_true_random=False))
def test_node_order_does_not_change_the_plan(model, nodes, strategy, rng):
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    plan = plan_or_none(model, nodes, strategy)
    assert plan == plan_or_none(model, shuffled, strategy)  # includes plan_id and idle


@FAST
@given(models(max_layers=7), swarms())
def test_balanced_matches_brute_force_on_every_objective(model, nodes):
    best = brute_force(model, nodes)
    for strategy in ("balanced", "memory"):  # both must find a plan exactly when one exists
        assert (plan_or_none(model, nodes, strategy) is None) == (best is None)
    if best is None:
        return
    plan = make_plan(model, nodes, "balanced")
    by_id = {node.node_id: node for node in nodes}
    times = [stage_time(by_id[s.node_id], s.n_layers, len(plan.stages)) for s in plan.stages]
    layers = {s.node_id: s.n_layers for s in plan.stages}
    deviation = sum(abs(layers.get(i, 0) - r) for i, r in ideal_shares(model, nodes).items())
    assert (max(times), deviation, sum(times)) == best
    assert plan.bottleneck_s == float(best[0])


@FAST
@given(models(max_layers=12))
def test_stage_bytes_is_the_heaviest_run_of_that_many_layers(model):
    n = model.n_layers
    for k in range(1, n + 1):
        runs = [model.range_bytes(a, a + k, False, False) for a in range(n - k + 1)]
        assert model.stage_bytes(k, False, False) == max(runs)
    assert model.total_bytes == sum(model.layer_costs) + model.embedding_bytes + model.head_bytes


def roomy(model: ModelSpec, nodes: list[NodeCapacity]) -> list[NodeCapacity]:
    """The same swarm with enough memory that no cap can bind."""
    extra = model.total_bytes
    return [NodeCapacity(n.node_id, n.memory_bytes + extra, n.seconds_per_layer) for n in nodes]


@FAST
@given(models(max_layers=40), swarms(max_nodes=6, max_memory=1000, hops=False))
def test_memory_strategy_is_within_one_layer_of_memory_share(model, nodes):
    nodes = roomy(model, nodes)
    plan = make_plan(model, nodes, "memory")
    got = {s.node_id: s.n_layers for s in plan.stages}
    total = sum(n.memory_bytes for n in nodes)
    for node in nodes:
        ideal = Fraction(model.n_layers * node.memory_bytes, total)
        assert abs(got.get(node.node_id, 0) - ideal) < 1


def hamilton(ideal: dict[str, Fraction]) -> dict[str, int]:
    """Largest-remainder rounding of the ideal shares (every count within one of ideal)."""
    counts = {k: int(r) for k, r in ideal.items()}
    left = round(sum(ideal.values())) - sum(counts.values())
    for k in sorted(ideal, key=lambda k: counts[k] - ideal[k])[:left]:
        counts[k] += 1
    return counts


@FAST
@given(models(max_layers=40), swarms(max_nodes=6, hops=False))
def test_balanced_is_close_to_speed_proportional_ideal(model, nodes):
    """An exact min-bottleneck split can not always stay within one layer of the
    ideal (see test_partitioner's counterexample), so the claims are:
    - the bottleneck is between the continuous optimum t* and t* + slowest speed;
    - whenever a within-one-layer split reaches the optimal bottleneck, the plan
      is within one layer of the ideal on every node."""
    nodes = roomy(model, nodes)
    plan = make_plan(model, nodes, "balanced")
    got = {s.node_id: s.n_layers for s in plan.stages}
    ideal = ideal_shares(model, nodes)
    speed = {n.node_id: Fraction(n.seconds_per_layer) for n in nodes}
    t_star = model.n_layers / sum(1 / v for v in speed.values())
    bottleneck = max(x * speed[k] for k, x in got.items())
    assert t_star <= bottleneck <= t_star + max(speed.values())

    rounded = hamilton(ideal)
    if max(x * speed[k] for k, x in rounded.items()) == bottleneck:
        for node_id, r in ideal.items():
            assert abs(got.get(node_id, 0) - r) < 1
