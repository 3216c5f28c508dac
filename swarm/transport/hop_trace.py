"""Opt-in timeline of decode steps across the nodes of one machine, at frame boundaries.

    SWARM_HOP_TRACE=/some/dir swarm-node ...   (benchmarks/hop_profile.py does it all)

The data lane (transport/lane.py) marks every message that enters or leaves a node:
"received" / "sent" for frames, the entry's own steps as STEP_START and tokens
reaching their entry as STEP_END. Nothing else on the hot path marks anything, so
a stage's compute is the gap from a frame received to the next one sent.

Each node process appends "event request position t_ns" lines to DIR/<pid>.trace.
t_ns is time.perf_counter_ns(), CLOCK_MONOTONIC on Linux: one clock for every
process of a machine, so the events of co-located nodes line up. Off (the
default), a mark costs one comparison.

`timeline` cuts the merged events into decode steps (from the entry sending a
step to the entry receiving its token) and returns the median gap between
consecutive events, i.e. where a step's time goes. One stream at a time only:
the steps of concurrent requests would interleave.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from .. import environment

ENV = environment.HOP_TRACE.name
STEP_START, STEP_END = "entry_send", "entry_token"

_dir = environment.HOP_TRACE.get()  # read once, at start: off, a mark costs one comparison
_file = None


def enabled() -> bool:
    return _dir is not None


def mark(event: str, header: dict) -> None:
    """Record `event` for the request and position the frame header names (when tracing)."""
    if _dir is None:
        return
    global _file
    if _file is None:
        _file = open(Path(_dir) / f"{os.getpid()}.trace", "a", buffering=1)
    _file.write(f"{event} {header.get('rid')} {header.get('pos', header.get('at'))} {time.perf_counter_ns()}\n")


def load(trace_dir: Path) -> list[tuple[int, str, str]]:
    """All events of all processes as (t_ns, process, event), in time order."""
    events = []
    for path in Path(trace_dir).glob("*.trace"):
        for line in path.read_text().splitlines():
            event, _rid, _pos, t = line.split()
            events.append((int(t), path.stem, event))
    return sorted(events)


def timeline(events: list[tuple[int, str, str]]) -> list[tuple[str, bool, float, int]]:
    """Per gap of a decode step: (from -> to, crosses processes, median µs, steps seen).

    Gaps are keyed by their place in the step, so a 3-node step lists each hop's
    gaps separately; gaps seen in fewer than half the steps (a prefill) are left out.
    """
    gaps: dict[tuple[int, str, bool], list[float]] = {}
    steps, step = 0, None
    for t, process, event in events:
        if event == STEP_START:
            step = [(t, process, event)]
        elif step is not None:
            step.append((t, process, event))
            if event == STEP_END:
                steps += 1
                for i, ((t0, p0, e0), (t1, p1, e1)) in enumerate(zip(step, step[1:])):
                    gaps.setdefault((i, f"{e0} -> {e1}", p0 != p1), []).append((t1 - t0) / 1e3)
                step = None
    return [(name, crosses, statistics.median(v), len(v))
            for (_, name, crosses), v in sorted(gaps.items()) if len(v) * 2 >= steps]
