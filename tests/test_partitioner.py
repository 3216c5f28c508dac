"""Worked examples for the partitioner: each pins one documented behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from partitioner import (
    InsufficientMemoryError,
    ModelSpec,
    NodeCapacity,
    Stage,
    make_plan,
)
from partitioner.__main__ import main
from partitioner.by_memory import largest_remainder
from partitioner.examples import deepseek_v3_4bit, deepseek_v3_4bit_per_layer, gemma3_27b_4bit, smollm2_135m

GB = 10**9


def node(node_id: str, memory: int = 100 * GB, speed: float = 1.0, hop: float = 0.0) -> NodeCapacity:
    return NodeCapacity(node_id, memory, speed, hop)


def layer_counts(plan) -> list[tuple[str, int]]:
    return [(s.node_id, s.n_layers) for s in plan.stages]


def test_equal_speeds_split_evenly_with_remainder_on_first_stages():
    model = ModelSpec(n_layers=30, bytes_per_layer=GB)
    plan = make_plan(model, [node("d"), node("b"), node("c"), node("a")])
    assert [s.n_layers for s in plan.stages] == [8, 8, 7, 7]
    assert plan.stages[0] == Stage("a", 0, 8)
    assert plan.stages[-1] == Stage("d", 23, 30)
    assert plan.bottleneck_s == 8.0
    assert plan.idle == ()


def test_three_to_one_speeds_give_about_three_to_one_layers():
    model = ModelSpec(n_layers=30, bytes_per_layer=GB)
    plan = make_plan(model, [node("slow", speed=3.0), node("fast", speed=1.0)])
    assert layer_counts(plan) == [("fast", 23), ("slow", 7)]
    assert plan.bottleneck_s == 23.0  # 22 + 8 would cost 24 on the slow node


def test_exact_bottleneck_can_leave_the_proportional_ideal_by_more_than_a_layer():
    # Ideal shares are 1.38 / 0.69 / 6.92 layers, bottleneck 0.69 s. Rounding
    # to (1, 1, 7) costs 1.0 s on "mid"; giving "fast" 8 layers costs 0.8 s.
    model = ModelSpec(n_layers=9, bytes_per_layer=GB)
    nodes = [node("fast", speed=0.1), node("mid", speed=0.5), node("slow", speed=1.0)]
    plan = make_plan(model, nodes)
    assert layer_counts(plan) == [("fast", 8), ("mid", 1)]
    assert plan.bottleneck_s == 0.8


def test_hop_latency_can_make_one_node_faster_than_two():
    model = ModelSpec(n_layers=4, bytes_per_layer=GB)
    plan = make_plan(model, [node("a", hop=10.0), node("b", hop=10.0)])
    assert layer_counts(plan) == [("a", 4)]  # alone: 4 s; split: 2 s + 10 s hop
    assert plan.bottleneck_s == 4.0
    assert [(i.node_id, i.reason) for i in plan.idle] == [("b", "not needed: faster without it")]


def test_memory_forces_a_slow_node_in_and_speed_decides_the_rest():
    model = ModelSpec(n_layers=10, bytes_per_layer=GB)
    fast = node("fast", memory=6 * GB, speed=1.0)
    slow = node("slow", memory=10 * GB, speed=2.0)
    plan = make_plan(model, [slow, fast])
    assert layer_counts(plan) == [("fast", 6), ("slow", 4)]
    assert plan.bottleneck_s == 8.0


def test_first_and_last_positions_go_where_the_extra_bytes_fit():
    # Only "big" has room for the embedding (first) and only "head" for the head (last).
    model = ModelSpec(n_layers=4, bytes_per_layer=GB, embedding_bytes=3 * GB, head_bytes=2 * GB)
    nodes = [node("head", memory=4 * GB), node("big", memory=5 * GB), node("mid", memory=1 * GB)]
    for strategy in ("balanced", "memory"):
        plan = make_plan(model, nodes, strategy)
        assert plan.stages[0].node_id == "big", strategy
        assert plan.stages[-1].node_id == "head", strategy
        assert sum(s.n_layers for s in plan.stages) == 4


def test_node_that_cannot_hold_one_layer_is_idle_with_the_numbers():
    model = ModelSpec(n_layers=2, bytes_per_layer=1000, kv_bytes_per_token_per_layer=2, context_tokens=100)
    plan = make_plan(model, [node("ok", memory=10_000), node("tiny", memory=999)])
    assert layer_counts(plan) == [("ok", 2)]
    assert [(i.node_id, i.reason) for i in plan.idle] == [
        ("tiny", "cannot hold one layer: needs 1,200 bytes, has 999")
    ]


def test_model_too_big_names_needed_and_available_bytes():
    model = ModelSpec(n_layers=10, bytes_per_layer=100, embedding_bytes=50, head_bytes=50)
    nodes = [node("a", memory=400), node("b", memory=500)]
    for strategy in ("balanced", "memory"):
        with pytest.raises(InsufficientMemoryError) as err:
            make_plan(model, nodes, strategy)
        assert isinstance(err.value, ValueError)
        assert err.value.needed_bytes == 1100
        assert err.value.available_bytes == 900
        assert "1,100" in str(err.value) and "900" in str(err.value)


def test_enough_bytes_in_total_but_not_splittable_still_raises():
    # 2 x 150 bytes = 300 >= 200 needed, but each node holds one 100-byte layer
    # and nobody has room for a layer plus the 60-byte embedding.
    model = ModelSpec(n_layers=1, bytes_per_layer=100, embedding_bytes=60)
    with pytest.raises(InsufficientMemoryError, match="enough in total"):
        make_plan(model, [node("a", memory=150), node("b", memory=150)])


def test_memory_strategy_is_proportional_to_memory():
    model = ModelSpec(n_layers=12, bytes_per_layer=1)
    plan = make_plan(model, [node("small", memory=100), node("big", memory=300)], "memory")
    assert layer_counts(plan) == [("big", 9), ("small", 3)]


def test_memory_strategy_leaves_a_node_whose_share_rounds_to_zero_idle():
    model = ModelSpec(n_layers=2, bytes_per_layer=1)
    plan = make_plan(model, [node("big", memory=100), node("small", memory=10)], "memory")
    assert layer_counts(plan) == [("big", 2)]
    assert [(i.node_id, i.reason) for i in plan.idle] == [
        ("small", "not needed: its memory share rounds to zero layers")
    ]


def test_memory_strategy_never_rounds_a_node_over_its_memory():
    # Largest remainder alone gives the 19-byte node 2 layers of 10 bytes (exo's bug).
    model = ModelSpec(n_layers=5, bytes_per_layer=10)
    memories = {"a": 33, "b": 19, "c": 19}
    assert largest_remainder(5, list(memories.values())) == [2, 2, 1]  # the trap is real
    plan = make_plan(model, [node(k, memory=m) for k, m in memories.items()], "memory")
    assert layer_counts(plan) == [("a", 3), ("b", 1), ("c", 1)]


def test_plan_id_is_short_hex_and_tracks_model_and_stages():
    model = ModelSpec(n_layers=8, bytes_per_layer=GB)
    nodes = [node("a"), node("b")]
    plan = make_plan(model, nodes)
    assert len(plan.plan_id) == 12 and int(plan.plan_id, 16) >= 0
    assert make_plan(model, list(reversed(nodes))).plan_id == plan.plan_id
    # A speed change that moves no layer keeps the id; a different model does not.
    assert make_plan(model, [node("a"), node("b", speed=1.01)]).plan_id == plan.plan_id
    other = ModelSpec(n_layers=8, bytes_per_layer=GB, context_tokens=1)
    assert make_plan(other, nodes).plan_id != plan.plan_id
    assert make_plan(model, [node("a"), node("c")]).plan_id != plan.plan_id


def test_to_dict_round_trips_through_json():
    model = ModelSpec(n_layers=3, bytes_per_layer=10, embedding_bytes=5, head_bytes=5)
    plan = make_plan(model, [node("a", memory=30), node("b", memory=30), node("c", memory=1)])
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["plan_id"] == plan.plan_id
    assert data["strategy"] == "balanced"
    assert data["model"]["n_layers"] == 3
    assert [(s["node_id"], s["start"], s["end"]) for s in data["stages"]] == [
        (s.node_id, s.start, s.end) for s in plan.stages
    ]
    assert data["idle"][0]["node_id"] == "c"
    assert data["bottleneck_s"] == plan.bottleneck_s


@pytest.mark.parametrize(
    "model, nodes, message",
    [
        (ModelSpec(0, 10), [node("a")], "positive number of layers"),
        (ModelSpec(-3, 10), [node("a")], "positive number of layers"),
        (ModelSpec(2, 0), [node("a")], "bytes_per_layer"),
        (ModelSpec(2, 10, embedding_bytes=-1), [node("a")], "embedding_bytes"),
        (ModelSpec(2, 10), [], "at least one node"),
        (ModelSpec(2, 10), [node("a"), node("a")], "duplicate node id 'a'"),
        (ModelSpec(2, 10), [node("a", memory=-1)], "memory must not be negative"),
        (ModelSpec(2, 10), [node("a", speed=0.0)], "seconds_per_layer"),
        (ModelSpec(2, 10), [node("a", speed=-1.0)], "seconds_per_layer"),
        (ModelSpec(2, 10), [node("a", speed=float("nan"))], "seconds_per_layer"),
        (ModelSpec(2, 10), [node("a", hop=-0.1)], "hop_latency_s"),
        (ModelSpec(2, layer_weight_bytes=(1,)), [node("a")], "one value per layer"),
        (ModelSpec(2, layer_weight_bytes=(1, -1)), [node("a")], "layer_weight_bytes must not be negative"),
        (ModelSpec(2, layer_weight_bytes=(0, 0)), [node("a")], "positive value"),
        (ModelSpec(2, 10, layer_kv_bytes=(1, 2, 3)), [node("a")], "layer_kv_bytes must give one value per layer"),
    ],
)
def test_malformed_input_is_rejected_with_a_clear_message(model, nodes, message):
    with pytest.raises(ValueError, match=message):
        make_plan(model, nodes)


def test_unknown_strategy_is_rejected():
    with pytest.raises(ValueError, match="unknown strategy 'fastest'"):
        make_plan(ModelSpec(2, 10), [node("a")], "fastest")


def test_smollm2_sizes_match_its_published_shape():
    model = smollm2_135m()
    assert model.bytes_per_layer == 14_160_384
    assert model.kv_bytes_per_token_per_layer == 1536
    weights = model.n_layers * model.bytes_per_layer + model.embedding_bytes
    assert 530 * 10**6 < weights < 545 * 10**6  # ~540 MB in float32


def test_each_layer_weighs_its_own_size():
    # Two light layers then two heavy ones: a stage is planned with the heaviest run of its length.
    model = ModelSpec(n_layers=4, layer_weight_bytes=(1, 1, 5, 5), embedding_bytes=2, head_bytes=3)
    assert model.layer_costs == (1, 1, 5, 5) and model.layer_bytes == 5
    assert [model.stage_bytes(k, False, False) for k in range(5)] == [0, 5, 10, 11, 12]
    assert model.range_bytes(0, 2, True, False) == 4 and model.range_bytes(2, 4, False, True) == 13
    assert model.total_bytes == 17
    # 13 bytes hold the embedding and any 3 consecutive layers, 8 the head and any one:
    # that fits, where "largest layer x n" would allow only 2 + 1 layers.
    memory = {"a": 13, "b": 8}
    for strategy in ("balanced", "memory"):
        plan = make_plan(model, [node(k, memory=m) for k, m in memory.items()], strategy)
        assert [(s.node_id, s.n_layers) for s in plan.stages] == [("a", 3), ("b", 1)]
        for i, s in enumerate(plan.stages):
            assert model.range_bytes(s.start, s.end, i == 0, i == 1) <= memory[s.node_id]


def test_an_average_layer_size_would_overflow_a_mixed_model_s_nodes():
    # DeepSeek V3's expert layers weigh more than the average layer; the old uniform spec
    # put 9 layers on a 56 GB node, which its real expert layers overflow.
    average, real = deepseek_v3_4bit(), deepseek_v3_4bit_per_layer()
    nodes = [NodeCapacity(f"s{i}", 56 * GB, 0.0008 if i >= 6 else 0.0005, 0.001) for i in range(8)]  # as in the docs
    last = len(nodes) - 1
    old = make_plan(average, nodes)
    assert any(real.range_bytes(s.start, s.end, i == 0, i == last) > 56 * GB for i, s in enumerate(old.stages))
    plan = make_plan(real, nodes)
    assert all(real.range_bytes(s.start, s.end, i == 0, i == last) <= 56 * GB for i, s in enumerate(plan.stages))


def test_sliding_window_layers_reserve_only_their_window():
    model = gemma3_27b_4bit(context_tokens=131072)
    global_kv, sliding_kv = model.layer_kv_bytes[5], model.layer_kv_bytes[0]
    assert global_kv == 128 * sliding_kv  # 131072 tokens against a window of 1024
    every_layer_full = ModelSpec(62, model.bytes_per_layer, model.embedding_bytes, model.head_bytes,
                                 model.kv_bytes_per_token_per_layer, 131072)
    assert model.total_bytes < 0.35 * every_layer_full.total_bytes
    nodes = [node("a", 16 * GB), node("b", 16 * GB)]
    assert len(make_plan(model, nodes).stages) == 2
    with pytest.raises(InsufficientMemoryError):
        make_plan(every_layer_full, nodes)


def test_per_layer_sizes_are_part_of_the_plan_id():
    a = ModelSpec(n_layers=3, layer_weight_bytes=(1, 2, 3))
    b = ModelSpec(n_layers=3, layer_weight_bytes=(3, 2, 1))
    assert make_plan(a, [node("x")]).plan_id != make_plan(b, [node("x")]).plan_id
    assert a.to_dict()["layer_weight_bytes"] == [1, 2, 3] and "layer_kv_bytes" not in a.to_dict()


def test_docs_show_exactly_what_the_examples_script_prints(capsys):
    assert main(["--examples"]) == 0
    printed = capsys.readouterr().out
    doc = (Path(__file__).parent.parent / "docs" / "partitioning.md").read_text()
    assert "InsufficientMemoryError" in printed and "| studio-7 |" in printed
    assert doc.endswith(printed), "regenerate the table: python -m partitioner --examples"


@pytest.mark.parametrize("strategy", ["balanced", "memory"])
def test_one_layer_that_no_node_can_hold_alone_is_refused_not_a_crash(strategy):
    # Found by hypothesis: a first and a last stage need two layers; the balanced search once
    # called a one-layer model splittable and then found no assignment (KeyError).
    model = ModelSpec(n_layers=1, bytes_per_layer=1, embedding_bytes=1, head_bytes=8,
                      kv_bytes_per_token_per_layer=0, context_tokens=0)
    with pytest.raises(InsufficientMemoryError):
        make_plan(model, [NodeCapacity("a", 2, 0.5), NodeCapacity("aa", 9, 0.5)], strategy)
