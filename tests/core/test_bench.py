"""The pure half of `qmgui bench`: the request, the engine's timings, the settings key, the
result's words and JSON."""

from __future__ import annotations

import pytest

from qmgui.core.bench import (
    TEXT_GRAMMAR,
    BenchResult,
    bench_text,
    completion_body,
    generation_rate,
    llama_bench_argv,
    measured_words,
    parse_llama_bench,
    parse_metrics,
    parse_timings,
    prompt_ids,
    result_line,
    settings_key,
)
from qmgui.core.errors import EngineError

ANSWER = {
    "content": "abc",
    "timings": {
        "cache_n": 0,
        "prompt_n": 512,
        "prompt_ms": 1650.0,
        "prompt_per_second": 310.3,
        "predicted_n": 128,
        "predicted_ms": 3106.8,
        "predicted_per_second": 41.2,
    },
}


def result(**kw: object) -> BenchResult:
    base: dict[str, object] = {
        "model_id": "/m/tiny.gguf", "model": "tiny", "settings": "-m /m/tiny.gguf -c 1024",
        "machine": "box", "build": "b10435", "devices": ("CPU",), "prompt_tokens": 512,
        "gen_tokens": 128,
        "prompt_tokens_per_s": 310.3, "generation_tokens_per_s": 41.2,
        "measured_at": "2026-12-02T01:10:00+00:00",
    }  # fmt: skip
    base.update(kw)
    return BenchResult(**base)  # type: ignore[arg-type]


def test_timings_are_the_engines_own() -> None:
    t = parse_timings(ANSWER)
    assert (t.prompt_n, t.predicted_n) == (512, 128)
    assert (t.prompt_per_second, t.predicted_per_second) == (310.3, 41.2)


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        ({"error": {"code": 500, "message": "boom"}}, "boom"),
        ({"content": "x"}, "no `timings`"),
        ({"timings": {"prompt_n": 1}}, "incomplete"),
        ({"timings": {**ANSWER["timings"], "predicted_n": 0}}, "no tokens"),  # type: ignore[dict-item]
        ([1, 2], "not a JSON object"),
    ],
)
def test_answers_without_timings_are_errors(answer: object, words: str) -> None:
    with pytest.raises(EngineError, match=words):
        parse_timings(answer)


def test_the_prompt_is_exactly_n_tokens_and_fixed() -> None:
    assert prompt_ids([5, 6, 7], 7) == [5, 6, 7, 5, 6, 7, 5]
    assert prompt_ids(list(range(100)), 3) == [0, 1, 2]
    assert bench_text(512) == bench_text(512) and len(bench_text(512)) >= 4 * 512
    with pytest.raises(EngineError):
        prompt_ids([], 4)
    body = completion_body([1, 2], 16)
    assert body == {
        "prompt": [1, 2], "n_predict": 16, "cache_prompt": False, "temperature": 0,
        "ignore_eos": True, "stream": False,
    }  # fmt: skip
    assert completion_body([1], 1, grammar=True)["grammar"] == TEXT_GRAMMAR


def test_settings_key_drops_what_does_not_change_the_speed() -> None:
    a = ["/opt/a/llama-server", "-m", "/m/x.gguf", "-c", "4096", "--port", "8080", "-lv", "4"]
    b = ["llama-server", "--host=0.0.0.0", "-m", "/m/x.gguf", "--metrics", "-c", "4096",
         "--port=9"]  # fmt: skip
    assert settings_key(a) == settings_key(b) == "-m /m/x.gguf -c 4096"
    assert settings_key([*a, "-ctk", "q8_0"]) != settings_key(a)


def test_result_round_trip_and_words() -> None:
    r = result()
    assert BenchResult.from_json(r.to_json()) == r
    assert r.to_json()["generation_tokens_per_s"] == 41.2
    assert measured_words(r) == (
        "last measured: 41.2 t/s generation, 310 t/s prompt (2026-12-02 01:10)"
    )
    assert measured_words(r, same_settings=False).endswith(", with other settings")
    assert "tiny: 310 t/s prompt (512 tokens), 41.2 t/s generation (128 tokens)" in result_line(r)
    with pytest.raises((KeyError, TypeError, ValueError)):
        BenchResult.from_json({"model_id": "x"})


METRICS = """\
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 16
llamacpp:tokens_predicted_seconds_total 0.5
llamacpp:prompt_tokens_seconds{slot="0"} 7818.61
odd line
llamacpp:bad nan-ish
"""


def test_metrics_and_the_live_generation_rate() -> None:
    m = parse_metrics(METRICS)
    assert m["llamacpp:tokens_predicted_total"] == 16
    assert m["llamacpp:prompt_tokens_seconds"] == 7818.61
    assert "odd" not in m and "llamacpp:bad" not in m
    later = {
        **m,
        "llamacpp:tokens_predicted_total": 116,
        "llamacpp:tokens_predicted_seconds_total": 2.5,
    }
    assert generation_rate(m, later) == 50.0
    assert generation_rate(later, later) is None  # nothing generated: idle
    assert generation_rate(later, m) is None  # counters went back: a restart
    assert generation_rate({}, m) is None


LLAMA_BENCH_OUT = """\
| model | size | params | backend | threads | test | t/s |
| --- | ---: | ---: | --- | ---: | ---: | ---: |
| qwen2 1.5B Q4_0 | 885.97 MiB | 1.54 B | Metal,BLAS | 16 | pp512 | 5765.41 ± 20.55 |
| qwen2 1.5B Q4_0 | 885.97 MiB | 1.54 B | Metal,BLAS | 16 | tg128 | 197.71 ± 0.81 |

build: 3e0ba0e60 (4229)
"""


def test_llama_bench_table() -> None:
    report = parse_llama_bench("ggml_init: noise\n" + LLAMA_BENCH_OUT)
    assert report.build == "b4229 (3e0ba0e60)"
    assert report.rate("pp") == (512, 5765.41) and report.rate("tg") == (128, 197.71)
    assert report.rows[0].backend == "Metal,BLAS"
    with pytest.raises(EngineError, match="no results table"):
        parse_llama_bench("error: no model\n")


def test_llama_bench_gets_the_commands_speed_settings() -> None:
    server = ["llama-server", "-m", "/m/x.gguf", "-c", "4096", "-ngl", "20", "-ctk", "q8_0",
              "--cache-type-v=q8_0", "-fa", "on", "-ts", "3,1", "--port", "8080"]  # fmt: skip
    argv = llama_bench_argv("/b/llama-bench", "/m/x.gguf", server, 256, 64)
    assert argv == [
        "/b/llama-bench", "-m", "/m/x.gguf", "-p", "256", "-n", "64", "-o", "md",
        "-ngl", "20", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "1", "-ts", "3/1",
    ]  # fmt: skip
