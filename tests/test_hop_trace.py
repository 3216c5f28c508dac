"""The hop profiler cuts merged node events into decode steps and finds where time goes."""

from __future__ import annotations

from swarm.transport import hop_trace


def test_marks_are_written_only_when_tracing(tmp_path, monkeypatch):
    monkeypatch.setattr(hop_trace, "_dir", None)
    hop_trace.mark("received", {"rid": "r", "pos": 3})
    assert not list(tmp_path.iterdir())
    monkeypatch.setattr(hop_trace, "_dir", str(tmp_path))
    monkeypatch.setattr(hop_trace, "_file", None)
    hop_trace.mark(hop_trace.STEP_START, {"rid": "r", "pos": 3})
    hop_trace.mark(hop_trace.STEP_END, {"rid": "r", "at": 4})
    hop_trace._file.close()
    events = hop_trace.load(tmp_path)
    assert [e for _, _, e in events] == [hop_trace.STEP_START, hop_trace.STEP_END]
    assert events[0][0] <= events[1][0]


def test_timeline_medians_per_gap_and_process_crossings(tmp_path):
    # Two nodes: the entry (process a) computes, sends to b, b computes and returns the token.
    a, b = [], []
    for step in range(3):
        t0 = (step + 1) * 100_000
        extra = 9_000 if step == 2 else 0  # one slow hand-over: the median ignores it
        a += [("entry_send", t0), ("compute_end", t0 + 20_000), ("sent", t0 + 21_000)]
        b += [("received", t0 + 22_000 + extra), ("sent", t0 + 50_000 + extra)]
        a += [("entry_token", t0 + 51_000 + extra)]
    # A prefill frame outside any step is ignored.
    b.insert(0, ("received", 1))
    for name, events in (("a", a), ("b", b)):
        (tmp_path / f"{name}.trace").write_text("".join(f"{e} r 0 {t}\n" for e, t in events))
    rows = hop_trace.timeline(hop_trace.load(tmp_path))
    assert [(name, crosses) for name, crosses, _, _ in rows] == [
        ("entry_send -> compute_end", False), ("compute_end -> sent", False), ("sent -> received", True),
        ("received -> sent", False), ("sent -> entry_token", True)]
    assert [median for _, _, median, _ in rows] == [20.0, 1.0, 1.0, 28.0, 1.0]
    assert all(n == 3 for _, _, _, n in rows)
