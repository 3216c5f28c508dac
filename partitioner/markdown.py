"""Render plans as markdown tables for humans (docs, logs)."""

from __future__ import annotations

from .errors import InsufficientMemoryError
from .examples import Example
from .links import HopCosts
from .planner import STRATEGIES, make_plan
from .stage_order import TripCosts


def human_bytes(n: int) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def render_example(example: Example) -> str:
    model, nodes = example.model, example.nodes
    by_id = {node.node_id: node for node in nodes}
    costs = model.layer_costs
    per_layer = (human_bytes(model.layer_bytes) if model.uniform
                 else f"{human_bytes(min(costs))} to {human_bytes(max(costs))}")
    lines = [
        f"### {example.title}",
        "",
        f"Model: {example.model_name}, {model.n_layers} layers, "
        f"{per_layer} per layer incl. KV for {model.context_tokens} tokens, "
        f"embedding {human_bytes(model.embedding_bytes)}, head {human_bytes(model.head_bytes)}, "
        f"{human_bytes(model.total_bytes)} in all.",
        "",
        "| node | memory for the model | time per layer per token | hop latency |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {n.node_id} | {human_bytes(n.memory_bytes)} | {ms(n.seconds_per_layer)} | {ms(n.hop_latency_s)} |"
        for n in nodes
    ]
    if example.links:
        lines += ["", f"Links: {example.links_note}"]
    for strategy in STRATEGIES:
        lines += ["", f"**{strategy}**", ""]
        try:
            plan = make_plan(model, nodes, strategy, links=example.links)
        except InsufficientMemoryError as err:
            lines.append(f"`InsufficientMemoryError: {err}`")
            continue
        lines += [
            "| stage | node | layers | count | bytes used / memory | free |",
            "|---:|---|---|---:|---:|---:|",
        ]
        last = len(plan.stages) - 1
        for i, stage in enumerate(plan.stages):
            used = model.range_bytes(stage.start, stage.end, i == 0, i == last)
            memory = by_id[stage.node_id].memory_bytes
            lines.append(
                f"| {i} | {stage.node_id} | [{stage.start}, {stage.end}) | {stage.n_layers} "
                f"| {human_bytes(used)} / {human_bytes(memory)} | {human_bytes(memory - used)} |"
            )
        lines += ["", f"Bottleneck stage: {ms(plan.bottleneck_s)}; plan_id `{plan.plan_id}`."]
        if example.links:
            lines.append(_trip_line(example, strategy, plan))
        lines += [f"Idle: {idle.node_id}, {idle.reason}." for idle in plan.idle]
    return "\n".join(lines)


def _trip_line(example: Example, strategy: str, plan) -> str:
    """A token's trip through the plan, against the plan made without the links."""
    costs = TripCosts(example.model, example.nodes, HopCosts([n.node_id for n in example.nodes], example.links))
    blind = make_plan(example.model, example.nodes, strategy)
    split = [(s.node_id, s.n_layers) for s in plan.stages]
    blind_split = [(s.node_id, s.n_layers) for s in blind.stages]
    return (f"A token's trip (compute and hops, a token and a prompt position alike): {ms(costs.trip(split) / 2)}; "
            f"the plan made without the links: {ms(costs.trip(blind_split) / 2)}.")


def render_examples(examples: tuple[Example, ...]) -> str:
    return "\n\n".join(render_example(example) for example in examples) + "\n"
