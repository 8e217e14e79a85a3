"""The command line's edges: a missing path is "not found", `plan`'s exit codes (0 fits, 1 does
not fit with the nearest setting that fits, 2 usage or a model that cannot be planned), a
vision projector refused as a model, `engines` alone lists, `--extra` takes the next word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qmgui.cli import join_extra
from tests.synth.factory import PRESETS, write_gguf, write_mmproj, write_split
from tests.test_cli import run


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "tiny-llama.gguf"
    write_gguf(path, PRESETS["llama"])
    return path


# --- a missing path ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["plan", "preview", "serve"])
def test_missing_model_is_not_found(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent.gguf"
    code, out, err = run(command, str(missing))
    assert code == 2
    assert out == ""
    assert f"{missing}: not found" in err
    assert "qmgui scan" in err  # what to do
    assert "vanished" not in err


def test_missing_folder_is_not_found(tmp_path: Path) -> None:
    code, _, err = run("plan", str(tmp_path / "no-such-folder") + "/")
    assert code == 2
    assert "not found" in err


# --- exit codes -------------------------------------------------------------------------------

NO_HOST = ("--host-memory", "none", "--reserve", "0")


def test_fits_exits_0_with_no_nearest(model: Path) -> None:
    code, out, _ = run("plan", str(model), "-c", "4096", "--gpu", "24GiB", *NO_HOST, "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["fits"] is True
    assert plan["nearest"] is None


def _too_small_gpu(model: Path) -> int:
    """A card a little smaller than what every layer of `model` at 4096 tokens needs."""
    code, out, _ = run("plan", str(model), "-c", "4096", "--gpu", "80GiB", *NO_HOST, "--json")
    assert code == 0
    gpu = next(d for d in json.loads(out)["devices"] if d["name"] == "GPU0")
    return int(gpu["total"]) - 1


def test_does_not_fit_exits_1_with_the_nearest_that_fits(model: Path) -> None:
    size = f"{_too_small_gpu(model)}B"
    code, out, _ = run("plan", str(model), "-c", "4096", "--gpu", size, *NO_HOST, "--json")
    assert code == 1
    plan = json.loads(out)
    assert plan["fits"] is False
    near = plan["nearest"]
    assert near is not None
    assert near["args"]  # what to change, as llama-server flags
    assert near["n_gpu_layers"] < plan["settings"]["n_gpu_layers"] or near["ctx_size"] < 4096
    # the nearest setting does fit
    code, again, _ = run(
        "plan", str(model), "-c", "4096", *near["args"], "--gpu", size, *NO_HOST, "--json"
    )
    assert code == 0, again
    # the table says it too
    code, text, _ = run("plan", str(model), "-c", "4096", "--gpu", size, *NO_HOST)
    assert code == 1
    assert "does not fit" in text
    assert f"nearest fit: {' '.join(near['args'])}" in text


def test_host_memory_nearest_is_a_shorter_context(model: Path) -> None:
    code, out, _ = run("plan", str(model), "-c", "4096", "--host-memory", "4MiB", "--json")
    if json.loads(out)["fits"]:
        pytest.skip("the plan fits in 4 MiB of host memory")
    assert code == 1
    near = json.loads(out)["nearest"]
    assert near is not None
    assert near["args"][:1] == ["-c"]
    assert near["ctx_size"] < 4096
    code, _, _ = run("plan", str(model), *near["args"], "--host-memory", "4MiB", "--json")
    assert code == 0


def test_nothing_fits_prints_no_nearest(model: Path) -> None:
    code, out, _ = run("plan", str(model), "-c", "4096", "--gpu", "1MiB", *NO_HOST)
    assert code == 1
    assert "nearest fit: none" in out


def test_broken_split_set_exits_2(tmp_path: Path) -> None:
    shards = write_split(tmp_path, PRESETS["llama"], n_shards=3)
    shards[2].unlink()
    code, _, err = run("plan", str(shards[0]), "--json")
    assert code == 2
    assert "missing shard" in err


def test_broken_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\3\0\0\0")
    code, out, _ = run("plan", str(bad))
    assert code == 2
    assert out == ""


def test_usage_error_exits_2(model: Path) -> None:
    code, _, _ = run("plan", str(model), "-c", "-5")
    assert code == 2


# --- projectors -------------------------------------------------------------------------------


def test_projector_is_refused_naming_its_model(tmp_path: Path) -> None:
    write_gguf(tmp_path / "tiny-llama.gguf", PRESETS["llama"])
    proj = tmp_path / "mmproj-tiny-llama.gguf"
    write_mmproj(proj)
    code, out, err = run("plan", str(proj), "--json")
    assert code == 2
    assert out == ""
    assert "vision projector" in err
    assert "belongs with tiny-llama" in err


@pytest.mark.parametrize("command", ["preview", "serve"])
def test_preview_and_serve_refuse_a_projector(command: str, tmp_path: Path) -> None:
    write_gguf(tmp_path / "tiny-llama.gguf", PRESETS["llama"])
    proj = tmp_path / "mmproj-tiny-llama.gguf"
    write_mmproj(proj)
    code, out, err = run(command, str(proj), "--no-probe")
    assert code == 2
    assert out == ""
    assert "belongs with tiny-llama" in err


def test_lone_projector_is_refused(tmp_path: Path) -> None:
    proj = tmp_path / "mmproj-something.gguf"
    write_mmproj(proj)
    code, _, err = run("plan", str(proj))
    assert code == 2
    assert "vision projector" in err
    assert "language model it belongs with" in err


# --- engines alone ----------------------------------------------------------------------------


def test_engines_without_a_verb_lists() -> None:
    assert run("engines") == run("engines", "list")
    code, out, err = run("engines")
    assert code == 0, err
    assert "running" in out or out == ""


# --- --extra takes the next word --------------------------------------------------------------


def test_join_extra() -> None:
    assert join_extra(["m", "--extra", "--jinja", "--port", "1"]) == [
        "m",
        "--extra=--jinja",
        "--port",
        "1",
    ]
    assert join_extra(["--extra=--x", "--extra"]) == ["--extra=--x", "--extra"]
    assert join_extra(["--", "--extra", "--x"]) == ["--", "--extra", "--x"]


@pytest.mark.parametrize(
    "extra",
    [
        ("--extra", "--jinja"),
        ("--extra", "--jinja --temp 0.7"),
        ("--extra", "--jinja", "--extra", "--temp 0.7"),
        ("--extra=--jinja --temp 0.7",),
    ],
)
def test_preview_extra_takes_the_next_word(model: Path, tmp_path: Path, extra: tuple[str]) -> None:
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    code, out, err = run(
        "preview", str(model), "--backend", str(exe), "--no-probe", *extra, "--json"
    )
    assert code == 0, err
    argv = json.loads(out)["argv"]
    assert "--jinja" in argv
    if len(" ".join(extra).split()) > 2:
        assert argv[argv.index("--temp") + 1] == "0.7"


@pytest.mark.parametrize("command", [("serve",), ("export", "script")])
def test_other_commands_take_extra_with_a_dash(command: tuple[str], model: Path) -> None:
    # parsing succeeds (what runs next may fail for other reasons): no argparse usage error;
    # main() joins `--extra WORD` for every command before argparse sees it
    from qmgui.cli import build_parser

    args = build_parser().parse_args(join_extra([*command, str(model), "--extra", "--jinja"]))
    assert args.extra == ["--jinja"]
