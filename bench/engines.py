"""Supervisor overheads, each beside a baseline measured in the same run.

    .venv/bin/python bench/engines.py [--runs N]

- ready latency: from the health endpoint first answering OK (seen by a 1 ms side poller) to
  the supervisor's READY callback (target < 150 ms); baseline: a bare 50 ms poll loop.
- stop latency: `Supervisor.stop()` for a well-behaved child and for one ignoring SIGTERM
  (grace 0.5 s); baseline: Popen.terminate() + wait() on the same child.
- idle CPU: the supervisor process's CPU time per second while one engine is ready; baseline:
  the same process with no engine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qmgui.engines.health import Health, check_health  # noqa: E402
from qmgui.engines.ports import free_port  # noqa: E402
from qmgui.engines.supervisor import EngineSpec, State, Supervisor  # noqa: E402

CHILD = str(ROOT / "tests" / "engines" / "supervisor_child.py")


def _spec(mode: str) -> EngineSpec:
    return EngineSpec(argv=(sys.executable, CHILD, mode), name=f"bench-{mode}")


def _side_poll(port_of: Callable[[], int | None], done: threading.Event, seen: list[float]) -> None:
    while not done.is_set():
        port = port_of()
        if port and check_health("127.0.0.1", port, timeout_s=0.2) == Health.READY:
            seen.append(time.monotonic())
            return
        time.sleep(0.001)


def ready_latency() -> float:
    ready_at: list[float] = []
    sup = Supervisor(
        _spec("healthy"),
        on_state=lambda s, st: ready_at.append(time.monotonic()) if st == State.READY else None,
    )
    seen: list[float] = []
    done = threading.Event()
    t = threading.Thread(target=_side_poll, args=(lambda: sup.port, done, seen))
    t.start()
    sup.start()
    sup.wait_ready(10)
    done.set()
    t.join()
    sup.stop()
    return max(0.0, ready_at[0] - seen[0])


def ready_baseline() -> float:
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, CHILD, "healthy", "--port", str(port)], stdout=subprocess.DEVNULL
    )
    seen: list[float] = []
    done = threading.Event()
    t = threading.Thread(target=_side_poll, args=(lambda: port, done, seen))
    t.start()
    while check_health("127.0.0.1", port) != Health.READY:
        time.sleep(0.05)
    ready = time.monotonic()
    done.set()
    t.join()
    p.terminate()
    p.wait()
    return max(0.0, ready - seen[0]) if seen else 0.0


def stop_latency(mode: str) -> float:
    sup = Supervisor(_spec(mode), stop_grace_s=0.5)
    sup.start()
    sup.wait_ready(10)
    t = time.monotonic()
    sup.stop()
    return time.monotonic() - t


def stop_baseline() -> float:
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, CHILD, "healthy", "--port", str(port)], stdout=subprocess.DEVNULL
    )
    while check_health("127.0.0.1", port) != Health.READY:
        time.sleep(0.02)
    t = time.monotonic()
    p.terminate()
    p.wait()
    return time.monotonic() - t


def idle_cpu(seconds: float, *, engine: bool) -> float:
    sup = None
    if engine:
        sup = Supervisor(_spec("healthy"))
        sup.start()
        sup.wait_ready(10)
    before = os.times()
    time.sleep(seconds)
    after = os.times()
    if sup is not None:
        sup.stop()
    used = (after.user - before.user) + (after.system - before.system)
    return used / seconds * 100


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--idle-s", type=float, default=3.0)
    a = ap.parse_args()
    os.environ.setdefault("QMGUI_LOG_DIR", tempfile.mkdtemp(prefix="qmgui-bench-logs-"))

    def med(f: Callable[..., float], *args: object) -> float:
        return statistics.median(f(*args) for _ in range(a.runs))

    rows = [
        ("ready latency (ms, target < 150)", med(ready_latency) * 1e3, med(ready_baseline) * 1e3),
        ("stop, well-behaved (ms)", med(stop_latency, "healthy") * 1e3, med(stop_baseline) * 1e3),
        (
            "stop, ignores SIGTERM, grace 0.5 s (ms)",
            med(stop_latency, "ignore-term") * 1e3,
            med(stop_baseline) * 1e3,
        ),
        (
            "supervisor CPU while idle (% of a core)",
            idle_cpu(a.idle_s, engine=True),
            idle_cpu(a.idle_s, engine=False),
        ),
    ]
    print(f"{'measure':44} {'qmgui':>10} {'baseline':>10}")
    for name, ours, base in rows:
        print(f"{name:44} {ours:10.2f} {base:10.2f}")


if __name__ == "__main__":
    main()
