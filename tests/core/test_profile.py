"""Profiles (qmgui.core.profile): applying saved values, keeping only what differs, and reading
a llama-server / vllm serve command line, hostile input included."""

from __future__ import annotations

import pytest

from qmgui.core.command_import import (
    CommandError,
    parse_command,
    probe_aliases,
    quote_token,
)
from qmgui.core.emit import split_each
from qmgui.core.launch import LaunchSettings
from qmgui.core.profile import (
    LAUNCH_FIELDS,
    apply_profile,
    describe,
    profile_from_settings,
    settings_fields,
    vllm_pins,
)


def test_launch_fields_are_launch_settings_fields() -> None:
    assert set(LAUNCH_FIELDS) <= set(settings_fields())


def test_a_profile_fills_defaults_but_not_what_was_given() -> None:
    profile = {"ctx_size": 16384, "cache_type_k": "q8_0", "n_gpu_layers": 10,
               "tensor_split": [3, 1], "parallel": 2}  # fmt: skip
    s = apply_profile(LaunchSettings(), profile)
    assert (s.ctx_size, s.cache_type_k, s.n_gpu_layers, s.tensor_split, s.parallel) == (
        16384, "q8_0", 10, (3.0, 1.0), 2,
    )  # fmt: skip
    # given explicitly (even at the default value) wins over the profile
    s = apply_profile(LaunchSettings(cache_type_k="f16"), profile, given={"cache_type_k"})
    assert s.cache_type_k == "f16" and s.ctx_size == 16384
    # a value that is not the default is never replaced
    assert apply_profile(LaunchSettings(ctx_size=4096), profile).ctx_size == 4096
    assert apply_profile(LaunchSettings(), None) == LaunchSettings()


def test_cpu_moe_wins_over_a_layer_count() -> None:
    s = apply_profile(LaunchSettings(), {"cpu_moe": True, "n_cpu_moe": 3})
    assert s.cpu_moe and s.n_cpu_moe == 0


def test_profile_from_settings_keeps_only_what_differs() -> None:
    defaults = LaunchSettings(ctx_size=8192)
    assert profile_from_settings(LaunchSettings(ctx_size=8192), defaults) == {}
    got = profile_from_settings(
        LaunchSettings(ctx_size=16384, cache_type_v="q8_0", tensor_split=(1.0, 1.0)), defaults
    )
    assert got == {"ctx_size": 16384, "cache_type_v": "q8_0", "tensor_split": [1.0, 1.0]}


def test_vllm_pins_from_a_profile_and_explicit_values() -> None:
    profile = {"ctx_size": 8192, "gpu_memory_utilization": 0.8, "tensor_parallel_size": 2,
               "tokenizer": "tok", "tool_call_parser": "hermes"}  # fmt: skip
    pins = vllm_pins(profile, extra_args=("--x",))
    assert (pins.max_model_len, pins.gpu_memory_utilization, pins.tensor_parallel_size) == (
        8192, 0.8, 2,
    )  # fmt: skip
    assert pins.tokenizer == "tok" and pins.tool_call_parser == "hermes"
    assert pins.extra_args == ("--x",)
    assert vllm_pins(profile, max_model_len=4096).max_model_len == 4096


def test_describe_says_each_value() -> None:
    words = describe({"ctx_size": 16384, "cache_type_k": "q8_0", "port": None, "x": 1})
    assert words == ["context 16,384", "K cache q8_0"]


def test_a_llama_server_command_with_aliases_and_equals_forms() -> None:
    parsed = parse_command(
        "CUDA_VISIBLE_DEVICES=0,1 ./llama-server -m '/m/my model.gguf' --ctx-size=16384 "
        "--gpu-layers 99 -fa -ctk q8_0 --cache-type-v=q8_0 --parallel 2 -ts 3/1 -sm row "
        "--host 0.0.0.0 --port 8081 --jinja --temp 0.7 -lv 3 \\\n --n-cpu-moe 4"
    )
    assert parsed.engine == "llama" and parsed.model == "/m/my model.gguf"
    assert parsed.values == {
        "ctx_size": 16384, "n_gpu_layers": 99, "flash_attn": "on", "cache_type_k": "q8_0",
        "cache_type_v": "q8_0", "parallel": 2, "tensor_split": [3.0, 1.0], "port": 8081,
        "n_cpu_moe": 4, "devices": [0, 1],
    }  # fmt: skip
    assert parsed.extra_args == ("-sm", "row", "--jinja", "--temp", "0.7")
    assert any("--host 0.0.0.0 dropped" in n for n in parsed.notes)
    assert any("-lv 3 dropped" in n for n in parsed.notes)


def test_flash_attention_spellings() -> None:
    assert parse_command("llama-server -fa on -c 1").values == {"flash_attn": "on", "ctx_size": 1}
    assert parse_command("llama-server -fa off").values["flash_attn"] == "off"
    assert parse_command("llama-server --flash-attn=auto").values["flash_attn"] == "auto"
    assert parse_command("llama-server -fa -c 4").values == {"flash_attn": "on", "ctx_size": 4}
    assert parse_command("llama-server -nfa").values["flash_attn"] == "off"


def test_short_and_long_spellings_of_each_known_flag() -> None:
    short = parse_command("llama-server -c 512 -np 3 -ngl 5 -ncmoe 2 -dev CUDA1,CUDA2 -mm p.gguf")
    long = parse_command(
        "llama-server --ctx-size 512 --parallel 3 --n-gpu-layers 5 --n-cpu-moe 2 "
        "--device CUDA1,CUDA2 --mmproj p.gguf"
    )
    assert short.values == long.values == {
        "ctx_size": 512, "parallel": 3, "n_gpu_layers": 5, "n_cpu_moe": 2, "devices": [1, 2],
        "mmproj": "p.gguf",
    }  # fmt: skip
    assert parse_command("llama-server -cmoe -ncmoe 3").values == {"cpu_moe": True}
    assert parse_command("llama-server -ngl all").values == {"n_gpu_layers": -1}


def test_a_vllm_serve_command() -> None:
    parsed = parse_command(
        "vllm serve Qwen/Qwen3-8B --max_model_len 32k -tp 2 --gpu-memory-utilization=0.85 "
        "--enable-auto-tool-choice --tool-call-parser hermes --tokenizer ./tok "
        "--trust-remote-code --host 0.0.0.0"
    )
    assert parsed.engine == "vllm" and parsed.model == "Qwen/Qwen3-8B"
    assert parsed.values == {
        "ctx_size": 32768, "tensor_parallel_size": 2, "gpu_memory_utilization": 0.85,
        "tool_call_parser": "hermes", "tokenizer": "./tok",
    }  # fmt: skip
    assert parsed.extra_args == ("--trust-remote-code",)
    alt = parse_command("python -m vllm.entrypoints.openai.api_server --model /m/x")
    assert alt.engine == "vllm" and alt.model == "/m/x"


def test_flags_only_and_windows_paths() -> None:
    parsed = parse_command(r"-m C:\models\x.gguf -c 2048")
    assert parsed.model == r"C:\models\x.gguf" and parsed.values == {"ctx_size": 2048}


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("", "empty"),
        ("llama-server -m 'x.gguf", "close the quote"),
        ("llama-server -m x.gguf -c", "-c needs a value"),
        ("llama-server -m x.gguf -c --jinja", "-c needs a value"),
        ("llama-server -c lots", "-c lots"),
        ("llama-server -c -5", "-c -5"),
        ("llama-server -ctk q9_9", "K cache type is one of"),
        ("llama-server -fa maybe=1 --flash-attn=maybe", "on, off or auto"),
        ("llama-server -ts 0,0", "a share per GPU"),
        ("llama-server --port 70000", "a port from 1 to 65535"),
        ("vllm serve m --gpu-memory-utilization 1.5", "fraction"),
        ("vllm serve m --gpu-memory-utilization nan", "fraction"),
        ("python script.py", "not a llama-server or vllm command"),
        ("llama-server -dev gpu-x", "devices such as CUDA0"),
    ],
)
def test_hostile_commands_are_sentences(command: str, words: str) -> None:
    with pytest.raises(CommandError, match=words):
        parse_command(command)


def test_unknown_flags_and_stray_words_are_kept_with_notes() -> None:
    parsed = parse_command(
        'llama-server -m m.gguf --mystery "a b" stray --chat-template "it\'s $HOME" --x=1',
        known_flags=frozenset({"-m", "--chat-template"}),
    )
    assert parsed.extra_args == ("--mystery", "a b", "stray", "--chat-template", "it's $HOME",
                                 "--x=1")  # fmt: skip
    assert any("--mystery is not in this build's --help" in n for n in parsed.notes)
    # a word after an unknown flag the build does not list is not taken as its value
    assert any("'a b' follows no flag" in n for n in parsed.notes)
    # what is stored splits back into the very same tokens
    assert split_each(parsed.profile()["extra_args"]) == parsed.extra_args


@pytest.mark.parametrize("token", ["plain", "a b", "it's", '"q"', "'", "", "a'b\"c", "$X \\ y"])
def test_quote_token_round_trips(token: str) -> None:
    assert split_each([quote_token(token)]) == (token,)


def test_environment_prefixes() -> None:
    parsed = parse_command("FOO=1 HIP_VISIBLE_DEVICES=2 llama-server -m m.gguf")
    assert parsed.values == {"devices": [2]}
    assert any("environment FOO dropped" in n for n in parsed.notes)
    # an explicit --device wins over the visibility variable
    parsed = parse_command("CUDA_VISIBLE_DEVICES=0 llama-server -dev CUDA1")
    assert parsed.values == {"devices": [1]}


def test_a_builds_own_spellings_of_known_flags_are_read() -> None:
    aliases = probe_aliases([("-c", "--ctx-size", "--context"), ("--temp",), ("-ngl", "--ngl")])
    assert aliases == {"--context": "-c", "--ngl": "-ngl"}
    parsed = parse_command("llama-server --context 512 --ngl 2 --temp 1", aliases=aliases)
    assert parsed.values == {"ctx_size": 512, "n_gpu_layers": 2}
    assert parsed.extra_args == ("--temp", "1")
