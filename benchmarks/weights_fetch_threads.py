"""Where a fetch's CPU goes: seconds per GB of each of the fetcher's threads, the holder's and a plain copy's.

    python benchmarks/weights_fetch_threads.py [--model DIR] [--rounds 4]

The same holders, fetch and copy as weights_fetch.py (imported from it), each path run
`--rounds` times in a row. Per thread, user and system CPU seconds per GB moved, from the
kernel's own count for that thread (getrusage RUSAGE_THREAD, read as each thread ends):
the fetch's link threads (two per holder; each receives, opens if sealed, hashes and
writes), its sync thread (the record of held chunks), the event loop; the holder's
process as a whole; the copy's sender process and its receiving thread (recv + write).
Load disturbs these less than rates; the 1-minute load is printed with each path. Linux only.
"""

from __future__ import annotations

import asyncio
import collections
import os
import resource
import statistics
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import weights_fetch as wf  # noqa: E402

from swarm.models.manifest import build_manifest  # noqa: E402

_spent: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])  # kind of thread -> user, system
_run = threading.Thread.run


def _counted_run(self) -> None:
    """Thread.run, then this thread's own CPU time added to its kind's (read on the thread, as it ends)."""
    try:
        _run(self)
    finally:
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        kind = "record sync" if self.name == "weights-sync" \
            else "links (receive, hash, write)" if self.name.startswith("link-") else self.name
        _spent[kind][0] += usage.ru_utime
        _spent[kind][1] += usage.ru_stime


def _row(name: str, user: float, system: float, gb: float) -> str:
    return f"| {name} | {user / gb:.3f} | {system / gb:.3f} | {(user + system) / gb:.3f} |"


def main() -> None:
    args = wf.parse_args(__doc__.splitlines()[0], rounds=4)
    threading.Thread.run = _counted_run
    manifest = build_manifest(args.model)
    gb = manifest.total_bytes * args.rounds / 1e9
    print(f"{args.model}: {manifest.total_bytes / 1e6:.0f} MB, {args.rounds} rounds per path\n")
    print("| thread | user s/GB | system s/GB | total s/GB |\n|---|---:|---:|---:|")
    sender, raw_port = wf._start(wf._raw_sender, str(args.model))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wf.raw_copy(raw_port, manifest.total_bytes, Path(tmp))  # warm-up, not counted
        before, sender_before, seconds = resource.getrusage(resource.RUSAGE_THREAD), wf._cpu_seconds(sender.pid), []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                os.sync()
                seconds.append(wf.raw_copy(raw_port, manifest.total_bytes, Path(tmp)))
        after = resource.getrusage(resource.RUSAGE_THREAD)
        print(f"| **copy** ({manifest.total_bytes / statistics.median(seconds) / 1e6:.0f} MB/s median; "
              f"load {os.getloadavg()[0]:.1f}) | | | |")
        print(f"| sender process | | | {(wf._cpu_seconds(sender.pid) - sender_before) / gb:.3f} |")
        print(_row("receiver (recv + write)", after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, gb))
    finally:
        sender.terminate()
    for secret in (False, True):
        holder, port = wf._start(wf._holder, str(args.model), secret)
        try:
            _spent.clear()
            before, holder_before, seconds = resource.getrusage(resource.RUSAGE_THREAD), wf._cpu_seconds(holder.pid), []
            for _ in range(args.rounds):
                with tempfile.TemporaryDirectory() as tmp:
                    os.sync()
                    took, store = asyncio.run(wf.fetch(port, manifest, Path(tmp), secret))
                    seconds.append(took)
                    store.wait_saved()
            after = resource.getrusage(resource.RUSAGE_THREAD)
            print(f"| **fetch, {'sealed' if secret else 'open'}** ({manifest.total_bytes / statistics.median(seconds) / 1e6:.0f}"
                  f" MB/s median; load {os.getloadavg()[0]:.1f}) | | | |")
            print(f"| holder process | | | {(wf._cpu_seconds(holder.pid) - holder_before) / gb:.3f} |")
            print(_row("event loop", after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, gb))
            for kind, (user, system) in sorted(_spent.items()):
                print(_row(kind, user, system, gb))
        finally:
            holder.terminate()


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
