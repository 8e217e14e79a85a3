"""`qmgui place`: several models on several GPUs from the command line, as a table, as JSON
and as a llama-swap config; per-model settings after `@`; exit status 1 when one does not
fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qmgui.cli.place import parse_spec
from qmgui.core.footprint import CONTEXT_BYTES
from qmgui.core.launch import LaunchSettings
from qmgui.core.placement import AutoContext
from qmgui.core.units import MIB
from tests.b11434 import need_b11434
from tests.core.test_export_hostile import swap_load
from tests.synth.factory import PRESETS, write_gguf, write_hf_folder
from tests.test_cli import run

# what-if GPUs are CUDA cards where each engine pays its context first: sizes below are that
# (per engine on the card) plus the test's
CTX_MIB = CONTEXT_BYTES["cuda"] // MIB


def mib(n: int, engines: int = 1) -> str:
    return f"{engines * CTX_MIB + n}MiB"


@pytest.fixture
def models(tmp_path: Path) -> Path:
    write_gguf(tmp_path / "llama.gguf", PRESETS["llama"])
    write_gguf(tmp_path / "qwen2.gguf", PRESETS["qwen2"])
    return tmp_path


def test_per_model_settings_follow_the_last_at() -> None:
    base = LaunchSettings(cache_type_k="q8_0")
    s = parse_spec("/m/a@b.gguf@c=8192,np=2,ngl=20,ctv=q8_0,fa=on,name=chat", base, "auto")
    assert s.path == "/m/a@b.gguf"
    assert s.name == "chat"
    assert s.context is None
    assert s.settings.ctx_size == 8192
    assert (s.settings.parallel, s.settings.n_gpu_layers) == (2, 20)
    assert (s.settings.cache_type_k, s.settings.cache_type_v) == ("q8_0", "q8_0")
    plain = parse_spec("/m/user@host.gguf", base, "auto")
    assert plain.path == "/m/user@host.gguf"
    assert plain.context == AutoContext()
    assert plain.settings.ctx_size is None
    with pytest.raises(ValueError, match="unknown setting 'bogus'"):
        parse_spec("/m/a.gguf@bogus=1", base, "auto")
    with pytest.raises(ValueError, match="ctk=q9: one of"):
        parse_spec("/m/a.gguf@ctk=q9", base, "auto")


def test_json_gives_each_model_its_cards_and_each_device_its_shares(models: Path) -> None:
    code, out, _ = run(
        "place",
        f"{models / 'llama.gguf'}@c=1024,np=2",
        f"{models / 'qwen2.gguf'}@c=2048",
        "--gpu", mib(64), "--gpu", mib(32), "--reserve", "0", "--json",
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert doc["fits"] is True
    rows = {m["name"]: m for m in doc["models"]}
    llama = rows["llama"]
    assert llama["placed"] and llama["context"] == 1024 and llama["slots"] == 2
    assert llama["context_per_slot"] == 512
    assert llama["tensor_split"] == []
    (card,) = llama["devices"]
    devices = {d["name"]: d for d in doc["devices"]}
    assert [d["name"] for d in doc["devices"]] == ["GPU0", "GPU1", "CPU"]
    share = {s["model"]: s["bytes"] for s in devices[card]["shares"]}
    assert share["llama"] == llama["bytes"][card]
    for d in doc["devices"][:2]:
        assert isinstance(d["budget"], int) and isinstance(d["used"], int)
        assert d["free"] == d["budget"] - d["used"] >= 0
        assert all(isinstance(s["bytes"], int) for s in d["shares"])


def test_a_model_that_does_not_fit_prints_why_and_the_nearest_fit(models: Path) -> None:
    code, out, _ = run(
        "place", str(models / "llama.gguf"), f"{models / 'qwen2.gguf'}@c=32768",
        "--gpu", mib(32, engines=2), "--reserve", "0",
    )  # fmt: skip
    assert code == 1
    assert "placed 1 of 2 models on 1 device\n" in out
    assert "not placed: qwen2: does not fit with 32768 tokens of context" in out
    assert "nearest: fits with a context of" in out
    code, out, _ = run(
        "place", str(models / "llama.gguf"), f"{models / 'qwen2.gguf'}@c=32768",
        "--gpu", mib(32, engines=2), "--reserve", "0", "--json",
    )  # fmt: skip
    assert code == 1
    (qwen,) = [m for m in json.loads(out)["models"] if not m["placed"]]
    assert qwen["nearest"][0]["kind"] == "context"
    assert qwen["nearest"][0]["context"] < 32768


def test_rpc_servers_are_devices_and_the_llama_swap_config_names_them(models: Path) -> None:
    code, out, _ = run(
        "place",
        f"{models / 'llama.gguf'}@c=1024",
        f"{models / 'qwen2.gguf'}@c=1024",
        "--gpu", mib(5), "--rpc", "10.0.0.2:50052=5MiB/cpu", "--reserve", "0",
        "--llama-swap", "-", "--backend", "/opt/llama.cpp/llama-server", "--no-probe",
    )  # fmt: skip
    assert code == 0
    doc = yaml.safe_load(out)
    cmds = {k: v["cmd"].split() for k, v in doc["models"].items()}
    remote = [k for k, c in cmds.items() if "--rpc" in c]
    local = [k for k, c in cmds.items() if "--rpc" not in c]
    assert len(remote) == len(local) == 1, cmds
    rc = cmds[remote[0]]
    assert rc[rc.index("--rpc") + 1] == "10.0.0.2:50052"
    assert rc[rc.index("--device") + 1] == "RPC0"
    lc = cmds[local[0]]
    assert lc[lc.index("--device") + 1] == "CUDA0"  # the first local GPU, after the remote one
    assert len(doc["groups"]) == 2
    assert sorted(doc["hooks"]["on_startup"]["preload"]) == sorted(cmds)


def test_usage_errors_and_models_that_cannot_be_placed(models: Path) -> None:
    code, _, err = run("place", f"{models / 'llama.gguf'}@np=x", "--gpu", "1GiB")
    assert code == 2 and "np=x" in err
    code, _, err = run("place", str(models / "llama.gguf"), "--rpc", "10.0.0.2=1GiB")
    assert code == 2 and "HOST:PORT=SIZE" in err
    write_hf_folder(models / "hf")
    code, out, _ = run("place", str(models / "hf"), str(models / "llama.gguf"), "--gpu", "1GiB")
    assert code == 1
    assert "not placed: " in out and "vLLM" in out


def test_a_literal_port_macro_in_a_path_stays_the_path(models: Path) -> None:
    odd = models / "${PORT}.gguf"
    odd.write_bytes((models / "llama.gguf").read_bytes())
    code, out, _ = run(
        "place", f"{odd}@c=1024", "--gpu", mib(64), "--reserve", "0",
        "--llama-swap", "-", "--backend", "/opt/llama.cpp/llama-server", "--no-probe",
    )  # fmt: skip
    assert code == 0
    loaded = swap_load(out, {}, windows=False)  # llama-swap's reading, macros included
    (model,) = loaded["models"].values()
    argv = model["argv"]
    assert argv[argv.index("-m") + 1] == str(odd)  # the path, not the port
    assert argv[argv.index("--port") + 1] == str(model["port"])


def test_without_a_gpu_models_are_placed_in_host_memory(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No GPU on this machine (none found, none given): host memory, the RAM free now less the
    OS floor."""
    from qmgui.cli import place as place_cmd

    monkeypatch.setattr(place_cmd, "gpus_from", lambda args: ())
    monkeypatch.setattr(place_cmd, "read_ram", lambda: (16 << 30, 6 << 30))
    code, out, _ = run("place", str(models / "llama.gguf"), str(models / "qwen2.gguf"), "--json")
    assert code == 0, out
    data = json.loads(out)
    (host,) = [d for d in data["devices"] if d["name"] == "CPU"]
    assert host["budget"] == (6 << 30) - place_cmd.OS_FLOOR
    assert {m["name"] for m in data["models"]} == {"llama", "qwen2"}
    assert all(m["placed"] and m["devices"] == [] for m in data["models"])
    code, out, _ = run("place", str(models / "llama.gguf"))
    assert code == 0 and "in host memory (no GPU)" in out and "CPU only" in out
    monkeypatch.setattr(place_cmd, "read_ram", lambda: (16 << 30, 1 << 30))  # all but 1 GiB used
    code, out, _ = run("place", str(models / "llama.gguf"))
    assert code == 1 and "does not fit in host memory" in out


def test_a_host_placement_charges_the_cpus_repacked_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Placed in host memory, a 4-bit model's weights the CPU backend repacks are charged as
    `qmgui plan` charges them: exactly where this CPU's features are known."""
    from dataclasses import replace as with_changes

    import gguf

    from qmgui.cli import place as place_cmd
    from qmgui.hw.host import cpu_target

    if cpu_target() is None or "AVX2" not in cpu_target().features:  # type: ignore[union-attr]
        pytest.skip("this CPU's repacking of Q4_0 is what the test checks (x86 AVX2)")
    spec = with_changes(PRESETS["llama"], weight_type=gguf.GGMLQuantizationType.Q4_0)
    model = write_gguf(tmp_path / "q4.gguf", spec)
    monkeypatch.setattr(place_cmd, "gpus_from", lambda args: ())
    code, out, _ = run("place", f"{model}@c=1024,np=1", "--json")
    assert code == 0, out
    (row,) = json.loads(out)["models"]
    (cpu,) = [d for d in row["devices_detail"] if d["name"] == "CPU"]
    code, out, _ = run("plan", str(model), "-c", "1024", "-np", "1", "--json")
    assert code == 0, out
    planned = next(d for d in json.loads(out)["devices"] if d["name"] == "CPU")
    assert cpu["repack"] == planned["repack"] > 0


def test_place_sizes_by_the_backends_build(models: Path) -> None:
    """`--backend PATH`: the placement sizes with that build's rules (b11434 keeps an extra
    input branch in its compute graph: more bytes than the default rules)."""
    engine = need_b11434()

    def host_bytes(*extra: str) -> int:
        code, out, err = run("place", str(models / "llama.gguf"), "--gpu", "24GiB", "-c", "1024",
                             "--json", *extra)  # fmt: skip
        assert code == 0, err
        (m,) = json.loads(out)["models"]
        return sum(m["bytes"].values())

    assert host_bytes("--backend", str(engine)) > host_bytes()


def test_script_starts_every_placed_model_on_its_own_port(models: Path) -> None:
    code, out, err = run(
        "place", str(models / "llama.gguf"), str(models / "qwen2.gguf"),
        "--gpu", "4GiB", "--no-probe", "--script", "-", "--port", "9100",
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("#!/usr/bin/env bash\n")
    assert 'BASE_PORT="${BASE_PORT:-9100}"' in out
    assert out.count("exec ") == 2 and out.count('pids+=("$!")') == 2
    for name in ("llama.gguf", "qwen2.gguf"):
        assert f"-m {models / name}" in out
    assert "PORT=$((BASE_PORT + 0))" in out and "PORT=$((BASE_PORT + 1))" in out


def test_a_model_is_placed_with_the_projector_its_command_loads(tmp_path: Path) -> None:
    """`--mmproj` is in the command: the card is charged its weights and compute bound too."""
    from qmgui.core.discovery import entry_for_path
    from tests.synth._mmproj import write_mmproj

    write_gguf(tmp_path / "vision" / "qwen3.gguf", PRESETS["qwen3"])
    write_mmproj(tmp_path / "vision" / "mmproj-qwen3.gguf")
    write_gguf(tmp_path / "text" / "qwen3.gguf", PRESETS["qwen3"])

    def placed(path: Path) -> int:
        code, out, _ = run(
            "place", f"{path}@c=1024,np=1", "--gpu", mib(64), "--reserve", "0", "--json"
        )  # fmt: skip
        assert code == 0
        (model,) = json.loads(out)["models"]
        assert model["placed"]
        return int(sum(model["bytes"].values()))

    proj = entry_for_path(tmp_path / "vision" / "mmproj-qwen3.gguf").meta
    assert proj is not None
    extra = placed(tmp_path / "vision" / "qwen3.gguf") - placed(tmp_path / "text" / "qwen3.gguf")
    assert extra > proj.weight_bytes > 0  # its weights, and its compute bound above them
    code, out, _ = run("place", f"{tmp_path / 'vision' / 'qwen3.gguf'}@c=1024,np=1",
                       "--gpu", mib(64), "--reserve", "0", "--json")  # fmt: skip
    (model,) = json.loads(out)["models"]
    assert [(b["part"], b["device"]) for b in model["bounds"]] == [("projector compute", "GPU0")]
    code, out, _ = run("place", f"{tmp_path / 'vision' / 'qwen3.gguf'}@c=1024,np=1",
                       "--gpu", mib(64), "--reserve", "0")  # fmt: skip
    assert code == 0 and "bound: qwen3: projector compute on GPU0 ≤ " in out
