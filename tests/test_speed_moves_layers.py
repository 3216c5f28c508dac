"""A node's re-measured speed is advertised only when it would move layers (node/speed_follower.py,
planning/coordinator.py): the partitioner sorts stages fastest first, so a speed that changes under load
would otherwise reorder equal stages, and every node would re-plan and replay its requests for a plan
no faster. A fixed view stands for discovery; the real-time behaviour is test_present_speed_netns.py's."""

from __future__ import annotations

import asyncio

from fixed_view import SPEC, FixedView

from swarm.node.present_speed import PresentSpeed
from swarm.node.speed_follower import SpeedFollower
from swarm.planning.coordinator import Coordinator
from swarm.planning.load_deadlines import LoadDeadlines


def coordinator(strategy: str) -> Coordinator:
    view = FixedView("b", {"a": {}, "b": {}, "c": {}})
    coord = Coordinator(view.own, SPEC, "fp", view, None, None, strategy=strategy,
                        deadlines=LoadDeadlines(view.own))
    coord.plan = coord._make_plan(coord.members())
    return coord


def test_a_speed_that_only_reorders_equal_stages_moves_no_layers():
    coord = coordinator("memory")  # layers by memory: equal memories, equal shares whatever the speeds
    assert not coord.moves_layers(0.0002), "ten times faster: first stage now, same layers"
    assert not coord.moves_layers(0.02)
    balanced = coordinator("balanced")
    assert balanced.moves_layers(0.02), "ten times slower where layers follow speed: fewer layers"
    assert not balanced.moves_layers(0.00201)


def test_the_follower_advertises_only_speeds_that_move_layers():
    published: list[float] = []

    async def publish(value: float) -> None:
        published.append(value)

    async def go(moves: bool) -> float:
        now = [0.0]
        follower = SpeedFollower(PresentSpeed(0.002), None, 0.0, publish, clock=lambda: now[0],
                                 moves_layers=lambda speed: moves)
        for _ in range(30):  # a node twice as slow, sampled on every check for 30 s
            now[0] += 1.0
            follower._samples.append((now[0], 0.004))
            await follower._check()
        return follower.present.advertised

    assert asyncio.run(go(False)) == 0.002 and published == []
    assert asyncio.run(go(True)) > 0.003 and len(published) == 1
