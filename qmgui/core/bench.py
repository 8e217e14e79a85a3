"""Speed measurements, as values: the fixed request `qmgui bench` sends, the engine's own
timings read from its answer, the key a result is kept under, and a result in words.

A measurement is one llama-server `/completion` request: a prompt of exactly N tokens (token
ids, cut from the tokenization of a fixed text, so every run sends the same prompt), M tokens
generated (`n_predict`, `ignore_eos`: the end-of-text token does not cut it short), greedy
(`temperature` 0) and with the prompt cache off (`cache_prompt` false: the prompt is processed
every time). The figures are the server's own (`timings.prompt_per_second`,
`timings.predicted_per_second`), not a clock around the request.

Running llama-server engines (started with `--metrics`) report counters at `/metrics`
(Prometheus text): `parse_metrics` reads them and `generation_rate` turns two readings into
the tokens per second generated between them (live speed in the Engines panel).

Results are kept per (machine, model, settings): the settings are the launch command's words
less the executable, the port, the host, the log verbosity and `--metrics` (what does not
change the speed), so the window finds the figure of the command its plan shows. Pure: no
network, no files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from qmgui.core.errors import EngineError

DEFAULT_PROMPT_TOKENS = 512
DEFAULT_GEN_TOKENS = 128
# printable ASCII: asked for only when the engine refuses the model's raw output (a model
# whose output is not text, such as the test suite's random tiny models)
TEXT_GRAMMAR = "root ::= [ -~]*"
# the fixed text the prompt's tokens are cut from (repeated as often as needed)
BENCH_TEXT = (
    "The quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing. "
    "Numbers such as 1024, 4096 and 65536 appear in tables of memory sizes; a careful reader "
    "checks each column, sums the rows and writes the totals at the bottom of the page. "
)
# argv words that do not change the speed: dropped from the settings key, with their values
_KEY_DROP_VALUE = frozenset({"--port", "--host", "-lv", "--verbosity", "--log-verbosity"})
_KEY_DROP = frozenset({"--metrics", "--no-webui", "--webui", "--ui", "--no-ui", "-v", "--verbose"})


@dataclass(frozen=True)
class Timings:
    """What the engine measured for one request."""

    prompt_n: int
    prompt_per_second: float
    predicted_n: int
    predicted_per_second: float


def bench_text(n_tokens: int) -> str:
    """The fixed text, long enough for `n_tokens` tokens with any tokenizer that gives at
    least one token per four characters (every real one)."""
    repeats = max(1, (n_tokens * 4) // len(BENCH_TEXT) + 1)
    return BENCH_TEXT * repeats


def prompt_ids(tokens: Sequence[int], n_tokens: int) -> list[int]:
    """Exactly `n_tokens` ids: the first ones of `tokens`, repeated when there are too few."""
    if n_tokens <= 0:
        raise EngineError("the prompt needs at least one token")
    if not tokens:
        raise EngineError("the engine tokenized the benchmark text into no tokens")
    ids = list(tokens)
    while len(ids) < n_tokens:
        ids.extend(tokens)
    return ids[:n_tokens]


def completion_body(
    prompt: Sequence[int] | str, gen_tokens: int, *, grammar: bool = False
) -> dict[str, Any]:
    """The `/completion` request of one measurement."""
    if gen_tokens <= 0:
        raise EngineError("the benchmark needs at least one generated token")
    body: dict[str, Any] = {
        "prompt": list(prompt) if not isinstance(prompt, str) else prompt,
        "n_predict": gen_tokens,
        "cache_prompt": False,
        "temperature": 0,
        "ignore_eos": True,
        "stream": False,
    }
    if grammar:
        body["grammar"] = TEXT_GRAMMAR
    return body


def parse_timings(response: Any) -> Timings:
    """The `timings` of a llama-server `/completion` answer (EngineError when it has none)."""
    if not isinstance(response, Mapping):
        raise EngineError("the engine's answer is not a JSON object")
    error = response.get("error")
    if error is not None:
        message = error.get("message") if isinstance(error, Mapping) else error
        raise EngineError(f"the engine answered with an error: {message}")
    t = response.get("timings")
    if not isinstance(t, Mapping):
        raise EngineError("the engine's answer has no `timings` (is it llama-server?)")
    try:
        timings = Timings(
            prompt_n=int(t["prompt_n"]),
            prompt_per_second=float(t["prompt_per_second"]),
            predicted_n=int(t["predicted_n"]),
            predicted_per_second=float(t["predicted_per_second"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise EngineError(f"the engine's `timings` are incomplete: {e}") from None
    if timings.predicted_n <= 0:
        raise EngineError("the engine generated no tokens")
    return timings


def settings_key(argv: Sequence[str]) -> str:
    """A launch command's words that shape its speed, as one string (see the module text)."""
    kept: list[str] = []
    words = list(argv[1:])
    i = 0
    while i < len(words):
        word = words[i]
        flag = word.split("=", 1)[0]
        if flag in _KEY_DROP_VALUE:
            i += 1 if "=" in word else 2
            continue
        if flag in _KEY_DROP:
            i += 1
            continue
        kept.append(word)
        i += 1
    return " ".join(kept)


@dataclass(frozen=True)
class BenchResult:
    """One measurement, as `qmgui bench --json` prints it and the store keeps it."""

    model_id: str
    model: str
    settings: str  # `settings_key` of the command that ran
    machine: str
    build: str | None
    devices: tuple[str, ...]
    prompt_tokens: int
    gen_tokens: int
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    measured_at: str  # ISO 8601, UTC
    url: str = ""
    started: bool = True  # the benchmark started the engine (False: it used a running one)
    grammar: bool = False  # the output was held to printable text (see TEXT_GRAMMAR)
    method: str = "server"  # "server": one /completion request; "llama-bench": its table

    def to_json(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "model": self.model,
            "settings": self.settings,
            "machine": self.machine,
            "build": self.build,
            "devices": list(self.devices),
            "prompt_tokens": self.prompt_tokens,
            "gen_tokens": self.gen_tokens,
            "prompt_tokens_per_s": round(self.prompt_tokens_per_s, 2),
            "generation_tokens_per_s": round(self.generation_tokens_per_s, 2),
            "measured_at": self.measured_at,
            "url": self.url,
            "started": self.started,
            "grammar": self.grammar,
            "method": self.method,
        }

    @classmethod
    def from_json(cls, d: Any) -> BenchResult:
        """ValueError / TypeError / KeyError when `d` is not a result."""
        if not isinstance(d, Mapping):
            raise TypeError("a benchmark result is a JSON object")
        build = d.get("build")
        return cls(
            model_id=str(d["model_id"]),
            model=str(d.get("model", "")),
            settings=str(d.get("settings", "")),
            machine=str(d["machine"]),
            build=None if build is None else str(build),
            devices=tuple(str(x) for x in d.get("devices", ())),
            prompt_tokens=int(d["prompt_tokens"]),
            gen_tokens=int(d["gen_tokens"]),
            prompt_tokens_per_s=float(d["prompt_tokens_per_s"]),
            generation_tokens_per_s=float(d["generation_tokens_per_s"]),
            measured_at=str(d["measured_at"]),
            url=str(d.get("url", "")),
            started=bool(d.get("started", True)),
            grammar=bool(d.get("grammar", False)),
            method=str(d.get("method", "server")),
        )

    def key(self) -> str:
        return result_key(self.machine, self.model_id, self.settings)


def result_key(machine: str, model_id: str, settings: str) -> str:
    return f"{machine}|{model_id}|{settings}"


def _rate(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _day(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return iso


def measured_words(result: BenchResult, *, same_settings: bool = True) -> str:
    """E.g. "last measured: 41.2 t/s generation, 310 t/s prompt (2026-12-02 01:10)"."""
    words = (
        f"last measured: {_rate(result.generation_tokens_per_s)} t/s generation, "
        f"{_rate(result.prompt_tokens_per_s)} t/s prompt ({_day(result.measured_at)})"
    )
    return words if same_settings else words + ", with other settings"


def result_line(result: BenchResult) -> str:
    """The line `qmgui bench` prints."""
    where = ", ".join(result.devices) or "unknown devices"
    return (
        f"{result.model}: {_rate(result.prompt_tokens_per_s)} t/s prompt "
        f"({result.prompt_tokens} tokens), {_rate(result.generation_tokens_per_s)} t/s "
        f"generation ({result.gen_tokens} tokens) on {result.machine} ({where}), "
        f"build {result.build or 'unknown'}"
        + (" (llama-bench)" if result.method == "llama-bench" else "")
    )


# llama-server's `/metrics` counters (Prometheus text)
GEN_TOKENS_TOTAL = "llamacpp:tokens_predicted_total"
GEN_SECONDS_TOTAL = "llamacpp:tokens_predicted_seconds_total"


def parse_metrics(text: str) -> dict[str, float]:
    """`name value` per sample line of a Prometheus text page (labels dropped, comments and
    odd lines skipped)."""
    out: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) < 2:
            continue
        try:
            out[parts[0].split("{", 1)[0]] = float(parts[1])
        except ValueError:
            continue
    return out


def generation_rate(prev: Mapping[str, float], cur: Mapping[str, float]) -> float | None:
    """Tokens generated per second of generating between two `/metrics` readings; None when
    nothing was generated between them (or the engine restarted: its counters went back)."""
    try:
        tokens = cur[GEN_TOKENS_TOTAL] - prev[GEN_TOKENS_TOTAL]
        seconds = cur[GEN_SECONDS_TOTAL] - prev[GEN_SECONDS_TOTAL]
    except KeyError:
        return None
    if tokens <= 0 or seconds <= 0:
        return None
    return tokens / seconds


# --- llama-bench ------------------------------------------------------------------------------
@dataclass(frozen=True)
class LlamaBenchRow:
    """One row of llama-bench's table: its test (`pp512`, `tg128`, `pp512+tg128`…), the
    tokens per second (the mean of its repetitions) and its backend column."""

    test: str
    tokens_per_s: float
    backend: str = ""


@dataclass(frozen=True)
class LlamaBenchReport:
    rows: tuple[LlamaBenchRow, ...]
    build: str | None  # "b4500 (1234abcd)" from its `build:` line

    def rate(self, prefix: str) -> tuple[int, float] | None:
        """The tokens and tokens/s of the first plain `pp…` or `tg…` test."""
        for r in self.rows:
            if r.test.startswith(prefix) and r.test[len(prefix) :].isdigit():
                return int(r.test[len(prefix) :]), r.tokens_per_s
        return None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_llama_bench(text: str) -> LlamaBenchReport:
    """llama-bench's markdown table (its default output), e.g.

        | model | size | params | backend | threads | test | t/s |
        | ----- | ---: | -----: | ------- | ------: | ---: | --: |
        | llama 1B F16 | 2.3 MiB | 1.2 M | CPU | 2 | pp512 | 30458.12 ± 120.50 |
        build: 1234abcd (10435)

    Lines that are not the table are ignored; EngineError when there is no table."""
    header: list[str] | None = None
    rows: list[LlamaBenchRow] = []
    build = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("build:"):
            words = line.split()
            if len(words) >= 3:
                build = f"b{words[2].strip('()')} ({words[1]})"
            continue
        if not line.startswith("|"):
            continue
        cells = _cells(line)
        if header is None:
            if "test" in cells and "t/s" in cells:
                header = cells
            continue
        if all(set(c) <= set("-: ") for c in cells) or len(cells) != len(header):
            continue
        test = cells[header.index("test")]
        rate = cells[header.index("t/s")].split("±")[0].strip()
        try:
            tps = float(rate)
        except ValueError:
            continue
        backend = cells[header.index("backend")] if "backend" in header else ""
        rows.append(LlamaBenchRow(test, tps, backend))
    if not rows:
        raise EngineError("llama-bench printed no results table")
    return LlamaBenchReport(tuple(rows), build)


# flags a llama-server command and llama-bench spell the same (their values pass as they are)
LLAMA_BENCH_SHARED = ("-ngl", "-ctk", "-ctv", "-t", "-b", "-ub", "-ts", "-sm", "-mg")
_SERVER_SPELLINGS = {
    "--n-gpu-layers": "-ngl", "--gpu-layers": "-ngl", "--cache-type-k": "-ctk",
    "--cache-type-v": "-ctv", "--threads": "-t", "--batch-size": "-b", "--ubatch-size": "-ub",
    "--tensor-split": "-ts", "--split-mode": "-sm", "--main-gpu": "-mg",
}  # fmt: skip


def llama_bench_argv(
    exe: str, model: str, server_argv: Sequence[str], prompt_tokens: int, gen_tokens: int
) -> list[str]:
    """llama-bench's command for the model with the server command's speed settings (GPU
    layers, KV types, threads, batch sizes, split; flash attention on/off), one repetition
    each of a `pp N` and a `tg M` test, as a markdown table."""
    argv = [exe, "-m", model, "-p", str(prompt_tokens), "-n", str(gen_tokens), "-o", "md"]
    words = list(server_argv[1:])
    for i, word in enumerate(words):
        flag, _, inline = word.partition("=")
        flag = _SERVER_SPELLINGS.get(flag, flag)
        value = inline or (words[i + 1] if i + 1 < len(words) else "")
        if flag in LLAMA_BENCH_SHARED and value:
            argv += [flag, value.replace(",", "/") if flag == "-ts" else value]
        elif flag in ("-fa", "--flash-attn") and value in ("on", "off"):
            argv += ["-fa", "1" if value == "on" else "0"]
    return argv
