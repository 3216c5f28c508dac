"""What a test host's processes cost: the packets its namespace sent and received (/proc/net/snmp, read
inside the host's network namespace), and a process's CPU seconds and resident memory (/proc/<pid>).

    before = counters(host); ...; after = counters(host)
    per_node = per_second([before...], [after...], seconds)   # mean over hosts, per second
    per_node = quiet_window(hosts, pids, seconds)             # the same over a window it waits out, and "cpu"
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from netns import Host


def counters(host: Host) -> dict[str, int]:
    """This host's namespace's UDP datagrams (mDNS) and TCP segments, sent and received."""
    lines = host.exec("cat", "/proc/net/snmp").stdout.splitlines()
    out = {}
    for names, values in zip(lines[::2], lines[1::2]):
        kind, *keys = names.split()
        for key, value in zip(keys, values.split()[1:]):
            out[f"{kind}{key}"] = int(value)
    return {"udp_out": out["Udp:OutDatagrams"], "udp_in": out["Udp:InDatagrams"],
            "tcp_out": out["Tcp:OutSegs"], "tcp_in": out["Tcp:InSegs"]}


def per_second(before: list[dict[str, int]], after: list[dict[str, int]], seconds: float) -> dict[str, float]:
    """Each counter's mean over the hosts, per host per second."""
    return {k: statistics.mean((a[k] - b[k]) / seconds for a, b in zip(after, before)) for k in before[0]}


def quiet_window(hosts: list[Host], pids: list[int], seconds: float) -> dict[str, float]:
    """Each counter's mean over the hosts per second, and "cpu": the processes' mean CPU share, over a
    window of `seconds` that this waits out (what the hosts do meanwhile is theirs alone)."""
    before, cpu0, t0 = [counters(h) for h in hosts], [cpu_seconds(p) for p in pids], time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - t0
    per = per_second(before, [counters(h) for h in hosts], took)
    per["cpu"] = statistics.mean((cpu_seconds(p) - c) / took for p, c in zip(pids, cpu0))
    per["seconds"] = took
    return per


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in clock ticks of 1/100 s


def rss_bytes(pid: int) -> int:
    """The process's resident memory now (VmRSS), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
