"""Measure a llama-server engine's speed, and keep the results.

`measure(url, ...)` sends the fixed request of `qmgui.core.bench` to an engine that is ready:
`/tokenize` of the fixed text cut to exactly N token ids, then one `/completion` generating M
tokens, and returns the engine's own timings. A model whose output is not text (the test
suite's random tiny models) makes recent builds refuse the answer ("does not match the
expected Content-only format"); the request is then sent again with its output held to
printable text (`TEXT_GRAMMAR`), and the result says so.

`bench_model(spec, entry, ...)` measures the model's running engine when the run registry
lists one (the same model id, or its file in the engine's command; it is left running), else
starts the spec under the supervisor (the command `qmgui serve` runs), waits until it is
ready, measures and stops it (its whole process group), whatever happens.

`read_metrics(url)` reads a running engine's `/metrics` counters (qmgui starts llama-server
with `--metrics`), for the live speed the Engines panel shows.

`run_llama_bench(spec, entry, ...)` runs the build's own llama-bench (beside its
llama-server) on the model with the command's speed settings, and reads its table.

`BenchStore` keeps the latest result per (machine, model, settings) in `bench.json` beside the
run registry (the state folder; `$QMGUI_STATE_DIR`), written atomically under a file lock,
at most `MAX_RESULTS` (the oldest go). An unreadable file is moved aside and reported.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from qmgui import notify
from qmgui.core.bench import (
    BenchResult,
    Timings,
    bench_text,
    completion_body,
    llama_bench_argv,
    parse_llama_bench,
    parse_metrics,
    parse_timings,
    prompt_ids,
    result_key,
    settings_key,
)
from qmgui.core.discovery import ModelEntry
from qmgui.core.errors import EngineError
from qmgui.core.readback import parse_llama_log
from qmgui.engines.adopt import Adopted
from qmgui.engines.json_store import JsonStore
from qmgui.engines.registry import RunEntry, RunRegistry, state_dir
from qmgui.engines.residuals import machine_name
from qmgui.engines.supervisor import EngineSpec, State, Supervisor

FILE_NAME = "bench.json"
VERSION = 1
MAX_RESULTS = 200
REQUEST_TIMEOUT_S = 600.0  # one completion on a large model on a CPU can take minutes
READY_TIMEOUT_S = 600.0
LOG_HEAD_BYTES = 4 << 20  # what of a running engine's log file is read for its devices
_NOT_TEXT = "does not match the expected"
_SOURCE = "bench"


# --- talking to the engine ------------------------------------------------------------------
def _request(url: str, method: str, path: str, body: Any, timeout_s: float) -> tuple[int, Any]:
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise EngineError(f"{url} is not an engine's address")
    import http.client  # noqa: PLC0415 - when measuring, not at start

    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Connection": "close"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    except (OSError, http.client.HTTPException) as e:
        raise EngineError(f"{url}{path}: {e}") from e
    finally:
        conn.close()
    try:
        data = json.loads(raw.decode("utf-8", errors="replace")) if raw else None
    except ValueError:
        data = None
    return resp.status, data


def _error_text(data: Any) -> str:
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))
        if err is not None:
            return str(err)
    return ""


def _prompt(url: str, n_tokens: int, timeout_s: float) -> list[int]:
    status, data = _request(url, "POST", "/tokenize", {"content": bench_text(n_tokens)}, timeout_s)
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if status != 200 or not isinstance(tokens, list):
        raise EngineError(
            f"the engine at {url} could not tokenize the benchmark prompt (HTTP {status}"
            f"{': ' + _error_text(data) if _error_text(data) else ''}); is it llama-server?"
        )
    return prompt_ids([int(t) for t in tokens if isinstance(t, int)], n_tokens)


def read_metrics(
    url: str, timeout_s: float = 1.0, *, api_key: str | None = None
) -> dict[str, float] | None:
    """The engine's `/metrics` counters; None when it serves none (not started with
    `--metrics`, not llama-server) or does not answer. `api_key`: the key it was started
    with (an engine serving beyond loopback asks for it)."""
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        return None
    import http.client  # noqa: PLC0415 - when measuring, not at start

    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        headers = {"Connection": "close"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        raw = resp.read(1 << 20)
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    if resp.status != 200:
        return None
    return parse_metrics(raw.decode("utf-8", errors="replace"))


def build_of(url: str, timeout_s: float = 5.0) -> str | None:
    """The engine's build (`/props` `build_info`), None when it does not say."""
    with contextlib.suppress(EngineError):
        status, data = _request(url, "GET", "/props", None, timeout_s)
        if status == 200 and isinstance(data, dict) and data.get("build_info"):
            return str(data["build_info"])
    return None


def measure(
    url: str,
    *,
    prompt_tokens: int,
    gen_tokens: int,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> tuple[Timings, bool]:
    """The engine's timings for the fixed request, and whether the output had to be held to
    printable text. EngineError when the engine does not answer with timings."""
    prompt = _prompt(url, prompt_tokens, timeout_s)
    grammar = False
    while True:
        body = completion_body(prompt, gen_tokens, grammar=grammar)
        status, data = _request(url, "POST", "/completion", body, timeout_s)
        if status == 200:
            return parse_timings(data), grammar
        message = _error_text(data)
        if not grammar and _NOT_TEXT in message:
            grammar = True  # the model's output is not text: ask for text and measure again
            continue
        raise EngineError(
            f"the engine at {url} refused the benchmark request (HTTP {status}"
            f"{': ' + message if message else ''})"
        )


# --- finding or starting the model's engine ---------------------------------------------------
def _runs_model(e: RunEntry, entry: ModelEntry) -> bool:
    if e.model_id:
        return e.model_id == entry.id
    return entry.path in e.argv


def running_engine(registry: RunRegistry, entry: ModelEntry) -> tuple[RunEntry, str] | None:
    """The model's engine the run registry lists as running, with its URL (None: none)."""
    for e in registry.running():
        if _runs_model(e, entry):
            url = Adopted(e).url
            if url is not None:
                return e, url
    return None


def _devices(log_text: str) -> tuple[str, ...]:
    return tuple(d.device for d in parse_llama_log(log_text).devices)


def _log_head(path: str | None) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            return f.read(LOG_HEAD_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _wait_ready(sup: Supervisor, timeout_s: float, stop: threading.Event | None) -> None:
    deadline = time.monotonic() + timeout_s
    while not sup.wait_ready(0.1):
        if sup.state.final:
            outcome = sup.outcome
            tail = "\n".join(outcome.log_tail[-5:]) if outcome else ""
            raise EngineError(f"{outcome or 'the engine ended'}" + (f"\n{tail}" if tail else ""))
        if stop is not None and stop.is_set():
            raise EngineError("the benchmark was stopped before the engine was ready")
        if time.monotonic() > deadline:
            raise EngineError(f"the engine was not ready after {timeout_s:g} s")


def bench_model(
    spec: EngineSpec,
    entry: ModelEntry,
    *,
    prompt_tokens: int,
    gen_tokens: int,
    registry: RunRegistry | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    stop: threading.Event | None = None,
    on_ready: Callable[[str, bool], None] | None = None,
) -> BenchResult:
    """Measure `entry` on its running engine, else on `spec` started for the purpose and
    stopped afterwards. `on_ready(url, started)` once there is an engine to measure."""
    if spec.kind != "llama":
        raise EngineError(
            f"{entry.name}: `qmgui bench` measures llama-server engines; this model runs on "
            f"{spec.kind}"
        )
    registry = registry if registry is not None else RunRegistry()
    found = running_engine(registry, entry)
    sup: Supervisor | None = None
    try:
        if found is not None:
            run_entry, url = found
            argv: tuple[str, ...] = run_entry.argv
            log_text = _log_head(run_entry.log_path)
        else:
            sup = Supervisor(replace(spec, downshift=False), registry=registry)
            sup.start()
            _wait_ready(sup, ready_timeout_s, stop)
            assert sup.url is not None
            url, argv = sup.url, sup.argv or spec.argv
            log_text = sup.log.text()
        if on_ready is not None:
            on_ready(url, sup is not None)
        timings, grammar = measure(
            url, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, timeout_s=request_timeout_s
        )
        build = build_of(url)
        if build is None:
            info = parse_llama_log(log_text).build
            build = f"b{info.number} ({info.commit})" if info is not None else None
        return BenchResult(
            model_id=entry.id,
            model=entry.name,
            settings=settings_key(argv),
            machine=machine_name(),
            build=build,
            devices=_devices(log_text),
            prompt_tokens=timings.prompt_n,
            gen_tokens=timings.predicted_n,
            prompt_tokens_per_s=timings.prompt_per_second,
            generation_tokens_per_s=timings.predicted_per_second,
            measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            url=url,
            started=sup is not None,
            grammar=grammar,
        )
    finally:
        if sup is not None and sup.state is not State.IDLE:
            sup.stop()


# --- llama-bench ------------------------------------------------------------------------------
def llama_bench_for(server: str) -> str | None:
    """The build's llama-bench: beside its llama-server (None: the build has none)."""
    path = shutil.which(server) or server
    name = "llama-bench.exe" if path.lower().endswith(".exe") else "llama-bench"
    candidate = Path(path).resolve().with_name(name)
    if not os.access(candidate, os.X_OK):
        candidate = Path(path).with_name(name)  # beside a link to it
    return str(candidate) if os.access(candidate, os.X_OK) else None


def run_llama_bench(
    spec: EngineSpec,
    entry: ModelEntry,
    *,
    prompt_tokens: int,
    gen_tokens: int,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> BenchResult:
    """Run the build's llama-bench on the model with the command's speed settings and read
    its table (EngineError when the build has none, or it fails)."""
    exe = llama_bench_for(spec.argv[0])
    if exe is None:
        raise EngineError(f"the build of {spec.argv[0]} has no llama-bench beside it")
    argv = llama_bench_argv(exe, entry.path, spec.argv, prompt_tokens, gen_tokens)
    env = {**os.environ, **(spec.env or {})}
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        raise EngineError(f"llama-bench did not finish in {timeout_s:g} s") from None
    except OSError as e:
        raise EngineError(f"llama-bench could not run: {e}") from e
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise EngineError(
            f"llama-bench failed (exit {done.returncode})" + (f":\n{tail}" if tail else "")
        )
    report = parse_llama_bench(done.stdout)
    pp, tg = report.rate("pp"), report.rate("tg")
    if pp is None or tg is None:
        raise EngineError("llama-bench's table has no pp and tg results")
    return BenchResult(
        model_id=entry.id,
        model=entry.name,
        settings=settings_key(spec.argv),
        machine=machine_name(),
        build=report.build,
        devices=tuple(dict.fromkeys(r.backend for r in report.rows if r.backend)),
        prompt_tokens=pp[0],
        gen_tokens=tg[0],
        prompt_tokens_per_s=pp[1],
        generation_tokens_per_s=tg[1],
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        method="llama-bench",
    )


# --- the store --------------------------------------------------------------------------------
class BenchStore:
    """The latest result per (machine, model, settings); thread- and process-safe."""

    def __init__(
        self, path: Path | None = None, *, notifier: notify.Notifier | None = None
    ) -> None:
        self.path = path or state_dir() / FILE_NAME
        self._file = JsonStore(
            self.path, key="results", version=VERSION, what="the benchmark results",
            source=_SOURCE, notifier=notifier,
        )  # fmt: skip

    def record(self, result: BenchResult) -> None:
        """Keep `result` (replacing the one of its key); OSError when it cannot be written."""
        with self._file.changing() as entries:
            entries[result.key()] = result.to_json()
            if len(entries) > MAX_RESULTS:
                newest = sorted(
                    entries.items(), key=lambda kv: str(kv[1].get("measured_at", "")), reverse=True
                )
                entries.clear()
                entries.update(newest[:MAX_RESULTS])

    def results(self) -> list[BenchResult]:
        """Every result kept (unreadable ones skipped), newest first. Reads without the lock:
        the file is only ever replaced whole."""
        out: list[BenchResult] = []
        for value in self._file.read().values():
            with contextlib.suppress(ValueError, TypeError, KeyError):
                out.append(BenchResult.from_json(value))
        out.sort(key=lambda r: r.measured_at, reverse=True)
        return out

    def latest(
        self, model_id: str, settings: str, *, machine: str | None = None
    ) -> tuple[BenchResult, bool] | None:
        """The result for these settings on this machine, else the model's newest one here
        with other settings; with whether the settings are the same. None: never measured."""
        machine = machine or machine_name()
        mine = [r for r in self.results() if r.machine == machine and r.model_id == model_id]
        key = result_key(machine, model_id, settings)
        for r in mine:
            if r.key() == key:
                return r, True
        return (mine[0], False) if mine else None
