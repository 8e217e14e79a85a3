"""`qmgui scan`: the table for people, `--json` for scripts, exit codes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from qmgui.cli import main
from qmgui.settings import Settings, save_settings
from tests.synth.factory import PRESETS, write_gguf


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def models(tmp_path: Path) -> Path:
    write_gguf(tmp_path / "m" / "tiny-llama.gguf", PRESETS["llama"])
    (tmp_path / "m" / "broken.gguf").write_bytes(b"GGUF\3\0\0\0")
    return tmp_path / "m"


def test_scan_json(models: Path) -> None:
    code, out, _ = run("scan", str(models), "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert set(rows) == {"tiny-llama", "broken"}
    good = rows["tiny-llama"]
    assert good["format"] == "gguf"
    assert good["architecture"] == "llama"
    assert good["class"] == "llm"
    assert good["shards"] == [str(models / "tiny-llama.gguf")]
    assert good["mmproj"] is None
    assert good["error"] is None
    assert isinstance(good["context_length"], int)
    assert rows["broken"]["error"]


def test_scan_table(models: Path) -> None:
    code, out, _ = run("scan", str(models))
    assert code == 0
    assert "tiny-llama" in out
    assert "NAME" in out.splitlines()[0]
    assert "2 models, 1 with errors" in out


def test_problems_go_to_stderr_and_exit_zero(tmp_path: Path) -> None:
    code, out, err = run("scan", str(tmp_path / "gone"))
    assert code == 0
    assert "not found" in err
    assert "No models found." in out


def test_usage_error_exits_2() -> None:
    code, _, _ = run("scan", "--bogus")
    assert code == 2
    code, _, _ = run("frobnicate")
    assert code == 2


def test_scan_without_paths_uses_configured_roots(models: Path) -> None:
    save_settings(Settings(model_roots=[str(models)]))
    code, out, _ = run("scan", "--json")
    assert code == 0
    assert {r["name"] for r in json.loads(out)} == {"tiny-llama", "broken"}


def test_scan_without_roots_says_what_to_do() -> None:
    code, _, err = run("scan")
    assert code == 0
    assert "qmgui scan ~/models" in err


def test_module_entry_point(models: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "qmgui", "scan", str(models), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert len(json.loads(out.stdout)) == 2


def test_plan_json_has_the_documented_shape(models: Path) -> None:
    model = models / "tiny-llama.gguf"
    code, out, _ = run("plan", str(model), "--ctx", "1000", "--parallel", "2", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["settings"]["n_ctx"] == 1024
    assert plan["settings"]["n_seq"] == 2
    assert plan["settings"]["n_ctx_seq"] == 512
    for key in ("n_batch", "n_ubatch", "cache_type_k", "cache_type_v", "flash_attn"):
        assert key in plan["settings"]
    (cpu,) = plan["devices"]  # no --gpu and no GPU here: a CPU-only plan
    assert cpu["name"] == "CPU"
    for key in ("weights", "kv", "recurrent", "compute", "output", "other", "total"):
        assert isinstance(cpu[key], int)
    assert cpu["kv"] > 0
    assert plan["fits"] is True
    assert plan["reason"] is None


def test_plan_for_a_gpu_that_need_not_exist(models: Path) -> None:
    code, out, _ = run(
        "plan", str(models / "tiny-llama.gguf"), "--gpu", "24GiB", "--gpu", "12GiB", "--json"
    )
    assert code == 0
    names = [d["name"] for d in json.loads(out)["devices"]]
    assert names == ["GPU0", "GPU1", "CPU"]


def test_plan_that_does_not_fit(models: Path) -> None:
    code, out, _ = run(
        "plan",
        str(models / "tiny-llama.gguf"),
        "-c",
        "4096",
        "--gpu",
        "1MiB",
        "--reserve",
        "0",
        "--json",
    )
    assert code == 1  # does not fit
    plan = json.loads(out)
    assert plan["fits"] is False
    assert "GPU0" in plan["reason"]
    assert plan["nearest"] is None  # not even every layer on the CPU fits a 1 MiB card


def test_plan_table_and_errors(models: Path, tmp_path: Path) -> None:
    code, out, _ = run("plan", str(models / "tiny-llama.gguf"), "-ctk", "q8_0", "-fa", "off")
    assert code == 0
    assert "KV q8_0/f16" in out
    assert "DEVICE" in out
    code, _, err = run("plan", str(models / "tiny-llama.gguf"), "-ctk", "q8_0")
    assert code == 2
    assert "do not divide" in err
    code, _, err = run("plan", str(models / "tiny-llama.gguf"), "--gpu", "lots")
    assert code == 2
    assert "no GPU profile called" in err
    code, _, err = run("plan", str(models / "tiny-llama.gguf"), "-ctv", "q8_0", "-fa", "off")
    assert code == 2
    assert "flash attention" in err
    code, _, err = run("plan", str(tmp_path / "missing.gguf"))
    assert code == 2
    assert "not found" in err
    assert "vanished" not in err


def test_plan_hf_folder_for_vllm(tmp_path: Path) -> None:
    from tests.synth.factory import write_hf_folder

    folder = write_hf_folder(tmp_path / "TinyChat")
    code, out, _ = run("plan", str(folder), "--gpu", "24GiB", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["engine"] == "vllm"
    assert "--max-model-len" in plan["args"]
    assert 0.10 <= plan["gpu_memory_utilization"] <= 0.95
    assert plan["fits"] is True
    code, _, err = run("plan", str(folder), "--engine", "llama")
    assert code == 2
    assert "--engine vllm" in err
    assert err.count("GGUF") == 1  # printed once, not again by logging


def test_plan_for_named_cards(models: Path) -> None:
    code, out, _ = run(
        "plan", str(models / "tiny-llama.gguf"), "--gpu", "2x3090", "--gpu", "12GiB", "--json"
    )
    assert code == 0
    names = [d["name"] for d in json.loads(out)["devices"]]
    assert names == ["GPU0 (RTX 3090)", "GPU1 (RTX 3090)", "GPU2", "CPU"]


def test_a_bare_number_is_a_card_not_bytes(models: Path) -> None:
    code, out, _ = run("plan", str(models / "tiny-llama.gguf"), "--gpu", "4090", "--json")
    assert code == 0
    (gpu, _cpu) = json.loads(out)["devices"]
    assert gpu["name"] == "GPU0 (RTX 4090)"


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`qmgui scan | head -1`: the reader leaves early; no traceback, the shell's SIGPIPE
    status (141)."""

    class ClosedPipe(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    write_gguf(tmp_path / "m.gguf", PRESETS["llama"])
    err = io.StringIO()
    assert main(["scan", str(tmp_path)], out=ClosedPipe(), err=err) == 141
    assert "Traceback" not in err.getvalue()


def test_a_path_as_the_command_scans_it(models: Path) -> None:
    code, out, _ = run(str(models), "--json")
    assert code == 0
    assert {r["name"] for r in json.loads(out)} == {"tiny-llama", "broken"}


def test_help_says_how_to_open_the_window(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run("--help")
    out = capsys.readouterr().out
    assert code == 0
    assert "open the window" in out and "--minimized" in out and "--screenshot" in out


def test_no_command_without_a_display_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    code, _, err = run()
    assert code == 0
    assert "no display" in err and "scanning" in err


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_never_gets_escape_sequences_from_names(tmp_path: Path) -> None:
    evil = tmp_path / "evil\x1b]0;pwned\x07\x1b[2J.gguf"
    write_gguf(evil, PRESETS["llama"])
    tty = _Tty()
    code = main(["plan", str(evil), "-c", "512"], out=tty, err=io.StringIO())
    assert code == 0
    text = tty.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;pwned\\x07" in text
    assert "\n" in text  # the table keeps its lines
    piped = io.StringIO()  # not a terminal: left as it is (JSON escapes by itself)
    main(["plan", str(evil), "-c", "512", "--json"], out=piped, err=io.StringIO())
    assert "\x1b" not in piped.getvalue()


def test_vllm_plan_and_preview_take_the_reserve_alike(tmp_path: Path) -> None:
    """`--reserve` is headroom left free on the card for `plan --engine vllm` as for
    `preview`: both size vLLM for the free memory less the reserve."""
    from tests.synth.factory import FULL_SIZE_PRESETS

    model = str(write_gguf(tmp_path / "q4b.gguf", FULL_SIZE_PRESETS["qwen3-4b"], sparse=True))

    def max_model_len(command: str, *extra: str) -> int:
        code, out, _ = run(command, model, "--engine", "vllm", "--gpu", "8GiB", "--json", *extra)
        assert code == 0
        data = json.loads(out)
        args = data["args"] if command == "plan" else data["argv"]
        return int(args[args.index("--max-model-len") + 1])

    for reserve, expected in (("0", 24576), ("2GiB", 12288)):
        assert max_model_len("plan", "--reserve", reserve) == expected
        assert max_model_len("preview", "--reserve", reserve) == expected
    # a vLLM budget (given or saved) is the budget: the reserve does not come off it
    for command in ("plan", "preview"):
        assert max_model_len(command, "--reserve", "2GiB", "--vllm-budget", "7GiB") == 20480


def test_vllm_tensor_parallel_is_every_gpu_planned_for(tmp_path: Path) -> None:
    from tests.synth.factory import write_hf_folder

    folder = str(write_hf_folder(tmp_path / "TinyChat"))

    def planned(*gpus: str) -> dict[str, object]:
        code, out, err = run("plan", folder, *gpus, "--json")
        assert code == 0, err
        return json.loads(out)  # type: ignore[no-any-return]

    one = planned("--gpu", "24GiB")
    assert one["tensor_parallel"] == 1 and "--tensor-parallel-size" not in one["args"]
    two = planned("--gpu", "2x24GiB")
    assert two["tensor_parallel"] == 2
    args = two["args"]
    assert isinstance(args, list) and args[args.index("--tensor-parallel-size") + 1] == "2"
    pinned = planned("--gpu", "2x24GiB", "-tp", "1")  # -tp pins it
    assert pinned["tensor_parallel"] == 1
