"""`qmgui place --role ROLE=MODEL[:KEY=VALUE,...]`: a role set (chat, embed, rerank, vision)
placed together, each instance with its role, replica, cards, context, slots and exact argv,
and exported as a llama-swap config and a bash script that starts them all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import gguf
import pytest

from qmgui.cli import place as place_cmd
from qmgui.core.discovery import entry_for_path
from qmgui.core.roles import CHAT_CTX, CHAT_MIN_CTX, EMBED_CTX
from tests.core.test_export_hostile import swap_load
from tests.synth.factory import FULL_SIZE_PRESETS, PRESETS, write_gguf, write_mmproj
from tests.test_cli import run
from tests.test_cli_place import mib


@pytest.fixture
def models(tmp_path: Path) -> Path:
    write_gguf(tmp_path / "chat.gguf", PRESETS["qwen3"])  # trained 40960
    write_gguf(tmp_path / "embed.gguf", PRESETS["qwen3-embed"])  # causal, pooling last
    write_gguf(tmp_path / "bge.gguf", PRESETS["bert"])  # encoder, pooling mean
    rank = replace(PRESETS["bert"], pooling_type=int(gguf.PoolingType.RANK))
    write_gguf(tmp_path / "rerank.gguf", rank)
    (tmp_path / "vl").mkdir()
    write_gguf(tmp_path / "vl" / "vl.gguf", PRESETS["llama"])
    write_mmproj(tmp_path / "vl" / "mmproj-vl.gguf", n_embd=256, n_ff=1024, n_layer=4)
    return tmp_path


def place_json(*argv: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run("place", *argv, "--no-probe", "--json")
    return code, json.loads(out) if out.strip() else {}, err


def rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in doc["models"]}


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_every_instance_carries_role_replica_cards_context_slots_and_argv(models: Path) -> None:
    code, doc, err = place_json(
        "--role", f"embed={models / 'embed.gguf'}",
        "--role", f"rerank={models / 'rerank.gguf'}",
        "--role", f"chat={models / 'chat.gguf'}:ctx=4096",
        "--gpu", "8GiB", "--gpu", "8GiB", "--reserve", "0", "--port", "9000",
    )  # fmt: skip
    assert code == 0, err
    r = rows(doc)
    assert set(r) == {"embed", "rerank", "chat"}
    for name, row in r.items():
        assert row["placed"] and row["role"] == name and row["replica"] == 0
        assert row["gpu_indices"] and row["argv"][0].endswith("llama-server")
        assert [d["name"] for d in doc["devices"]][row["gpu_indices"][0]] == row["devices"][0]
    embed = r["embed"]["argv"]
    assert (r["embed"]["slots"], r["embed"]["context"]) == (1, EMBED_CTX)
    assert "--embedding" in embed and flag(embed, "--pooling") == "last"
    assert flag(embed, "-b") == flag(embed, "-ub") == str(EMBED_CTX) == flag(embed, "-c")
    assert flag(embed, "-fa") == "off" and flag(embed, "-np") == "1"
    rerank = r["rerank"]["argv"]
    assert "--reranking" in rerank and "--embedding" not in rerank
    assert r["rerank"]["rerank_mode"] == "cross" and r["rerank"]["slots"] == 1
    assert flag(rerank, "-b") == flag(rerank, "-c") == "512"  # its trained context
    assert "-ub" not in rerank  # 512 is the engine's micro-batch already
    chat = r["chat"]["argv"]
    assert (r["chat"]["slots"], r["chat"]["context_per_slot"]) == (4, 4096)
    assert flag(chat, "-np") == "4" and flag(chat, "-c") == str(4 * 4096)
    assert flag(chat, "-fa") == "on"  # what-if cards are CUDA: flash attention asked outright
    assert "--embedding" not in chat and "--reranking" not in chat
    ports = sorted(int(flag(x["argv"], "--port")) for x in r.values())
    assert ports == [9000, 9001, 9002] == sorted(x["port"] for x in r.values())
    for row in r.values():
        assert flag(row["argv"], "--device") == ",".join(f"CUDA{i}" for i in row["gpu_indices"])


def test_search_roles_are_sized_first_and_chat_warns_below_what_was_asked(models: Path) -> None:
    # one card: the embedder (a 4096-token batch without flash attention) takes its share
    # first; chat gets the rest, short of 4 x 32768 (each engine pays the CUDA context)
    card = mib(380, engines=2)
    code, doc, err = place_json(
        "--role", f"chat={models / 'chat.gguf'}",
        "--role", f"embed={models / 'embed.gguf'}",
        "--gpu", card, "--reserve", "0",
    )  # fmt: skip
    assert code == 0, err
    r = rows(doc)
    assert [m["name"] for m in doc["models"]] == ["embed", "chat"]  # placement order
    assert r["embed"]["context"] == EMBED_CTX  # not squeezed by chat
    chat = r["chat"]
    assert (chat["context_asked"], chat["slots_asked"]) == (CHAT_CTX, 4)
    assert chat["slots"] * chat["context_per_slot"] < 4 * CHAT_CTX
    (warning,) = [w for w in doc["warnings"] if "downsized" in w]
    assert f"{chat['slots']} slot(s) x {chat['context_per_slot']} tokens" in warning
    assert "downsized" in err  # said on the terminal as well
    # alone on the same card chat has more room than beside the embedder
    _, alone, _ = place_json("--role", f"chat={models / 'chat.gguf'}", "--gpu", card,
                             "--reserve", "0")  # fmt: skip
    a = rows(alone)["chat"]
    assert a["slots"] * a["context_per_slot"] > chat["slots"] * chat["context_per_slot"]


def test_replicas_on_two_what_if_cards(models: Path) -> None:
    code, doc, err = place_json(
        "--role", f"embed={models / 'bge.gguf'}:replicas=auto",
        "--role", f"rerank={models / 'rerank.gguf'}:replicas=2,name=rr",
        "--gpu", "4GiB", "--gpu", "4GiB", "--reserve", "0",
    )  # fmt: skip
    assert code == 0, err
    r = rows(doc)
    assert set(r) == {"embed-1", "embed-2", "rr-1", "rr-2"}
    for base in ("embed", "rr"):
        pair = [r[f"{base}-1"], r[f"{base}-2"]]
        assert [p["replica"] for p in pair] == [0, 1] and {p["replicas"] for p in pair} == {2}
        assert sorted(p["gpu_indices"] for p in pair) == [[0], [1]]  # distinct cards
        assert sorted(flag(p["argv"], "--device") for p in pair) == ["CUDA0", "CUDA1"]
    # two replicas asked on one card: the second has no card of its own
    code, doc, _ = place_json(
        "--role", f"rerank={models / 'rerank.gguf'}:replicas=2", "--gpu", "4GiB",
    )  # fmt: skip
    assert code == 1
    assert [m["placed"] for m in doc["models"]] == [True, False]
    # auto on one card is one replica, and exit 0
    code, doc, _ = place_json("--role", f"embed={models / 'bge.gguf'}:replicas=auto",
                              "--gpu", "4GiB")  # fmt: skip
    assert code == 0 and [m["name"] for m in doc["models"]] == ["embed"]


def test_an_idle_card_widens_chat(tmp_path: Path) -> None:
    # a 4B model (sparse file) alone on a 4 GiB card holds ~9k tokens; the idle second card
    # widens it toward its 32768-token target
    big = write_gguf(tmp_path / "q4b.gguf", FULL_SIZE_PRESETS["qwen3-4b"], sparse=True)
    _, single, _ = place_json("--role", f"chat={big}", "--gpu", "4GiB", "--reserve", "0")
    _, double, _ = place_json("--role", f"chat={big}", "--gpu", "4GiB", "--gpu", "4GiB",
                              "--reserve", "0")  # fmt: skip
    s, d = rows(single)["chat"], rows(double)["chat"]
    assert s["context_per_slot"] < CHAT_CTX and len(s["gpu_indices"]) == 1
    assert sorted(d["gpu_indices"]) == [0, 1]
    assert d["context"] >= 1.25 * s["context"]
    assert any("widened onto idle" in n for n in d["notes"])
    assert flag(d["argv"], "-ts") == ",".join(f"{x:g}" for x in d["tensor_split"])


def test_a_chat_below_a_grounded_window_trades_layers_for_it_or_is_refused(
    tmp_path: Path,
) -> None:
    # the 4B model (2.1 GiB of weights) on a 3.6 GiB card holds 6400 tokens beside all its
    # layers: below the 8192 a grounded answer needs. It leaves layers in system memory to
    # hold 8192; with ngl= it may not, and is refused with the numbers; ctx=4096 asks for less
    big = write_gguf(tmp_path / "q4b.gguf", FULL_SIZE_PRESETS["qwen3-4b"], sparse=True)
    card = ("--gpu", "3.6GiB", "--reserve", "0")
    code, doc, _ = place_json("--role", f"chat={big}", *card)
    chat = rows(doc)["chat"]
    assert code == 0 and chat["context_per_slot"] >= CHAT_MIN_CTX
    assert int(flag(chat["argv"], "-ngl")) < 37  # 36 layers and the output
    (traded,) = [w for w in doc["warnings"] if "to hold the 8192-token window" in w]
    assert traded.startswith("chat: ") and "layers on the GPU" in traded
    code, doc, _ = place_json("--role", f"chat={big}:ngl=99", *card)
    chat = rows(doc)["chat"]
    assert code == 1 and not chat["placed"]
    assert "holds only a 6400-token context" in chat["reason"]
    assert f"a grounded answer needs about {CHAT_MIN_CTX} tokens" in chat["reason"]
    code, doc, _ = place_json("--role", f"chat={big}:ctx=4096", *card)
    chat = rows(doc)["chat"]
    assert code == 0 and chat["context_per_slot"] == 4096
    assert int(flag(chat["argv"], "-ngl")) == 37
    # the weights alone do not fit the card: no trade, a model that answers from host memory
    code, doc, _ = place_json("--role", f"chat={big}", "--gpu", "2GiB", "--reserve", "0")
    assert code == 1 and not rows(doc)["chat"]["placed"]


def test_a_remote_role_gets_no_local_server(models: Path, tmp_path: Path) -> None:
    roles = ("--role", f"embed={models / 'embed.gguf'}",
             "--role", "chat=remote:https://api.example.com/v1", "--gpu", "8GiB")  # fmt: skip
    code, doc, _ = place_json(*roles)
    assert code == 0
    assert [m["name"] for m in doc["models"]] == ["embed"]  # chat is not placed, nor unplaced
    assert doc["remote"] == [
        {"name": "chat", "role": "chat", "endpoint": "https://api.example.com/v1"}
    ]
    code, out, _ = run("place", *roles, "--no-probe")
    assert code == 0 and "chat (chat): served by https://api.example.com/v1, no local server" in out
    code, out, _ = run("place", *roles, "--no-probe", "--llama-swap", "-")
    assert code == 0 and set(swap_load(out, {}, windows=False)["models"]) == {"embed"}


def test_a_model_not_installed_is_reported_apart_from_one_that_does_not_fit(
    models: Path,
) -> None:
    embed, gone = f"embed={models / 'embed.gguf'}", f"chat={models / 'gone.gguf'}"
    code, doc, err = place_json("--role", embed, "--role", gone, "--gpu", "8GiB")
    assert code == 1
    assert [m["name"] for m in doc["models"]] == ["embed"]  # neither placed nor unplaced
    assert doc["not_installed"] == [
        {"name": "chat", "role": "chat", "model": str(models / "gone.gguf")}
    ]
    assert "chat: " in err and "is not installed" in err
    assert any("is not installed" in w for w in doc["warnings"])


def test_a_placement_without_a_gpu(models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(place_cmd, "gpus_from", lambda args: ())
    code, doc, err = place_json(
        "--role", f"embed={models / 'embed.gguf'}:replicas=auto",
        "--role", f"chat={models / 'chat.gguf'}:ctx=8192",
        "--host-memory", "6GiB",
    )  # fmt: skip
    assert code == 0, err
    r = rows(doc)
    assert set(r) == {"embed", "chat"}  # auto replicas without a GPU: one
    for row in r.values():
        assert row["devices"] == [] and row["n_gpu_layers"] == 0
        assert flag(row["argv"], "-ngl") == "0" and "--device" not in row["argv"]
    assert flag(r["chat"]["argv"], "-fa") == "on"  # the CPU's flash attention is complete
    host = next(d for d in doc["devices"] if d["name"] == "CPU")
    assert {s["model"] for s in host["shares"]} == {"embed", "chat"}
    assert host["used"] <= host["budget"] == 6 << 30


def test_vision_needs_its_projector(models: Path) -> None:
    code, doc, err = place_json(
        "--role", f"vision={models / 'vl' / 'vl.gguf'}",
        "--role", f"vision={models / 'chat.gguf'}:name=blind",
        "--role", f"chat={models / 'vl' / 'vl.gguf'}:ctx=4096,slots=2",
        "--gpu", "4GiB", "--reserve", "0",
    )  # fmt: skip
    assert code == 0, err  # skipped with a warning, not a failure
    r = rows(doc)
    assert set(r) == {"vision", "chat"}
    assert doc["skipped"] == [
        {
            "role": "vision",
            "model": str(models / "chat.gguf"),
            "reason": doc["skipped"][0]["reason"],
        }
    ]
    assert "no projector" in doc["skipped"][0]["reason"] and "no projector" in err
    vision, chat = r["vision"], r["chat"]
    mmproj = str(models / "vl" / "mmproj-vl.gguf")
    assert flag(vision["argv"], "--mmproj") == mmproj
    assert "--mmproj" not in chat["argv"]  # chat of a multimodal model: text only
    # the same model and settings: vision is charged its projector on top
    proj = entry_for_path(mmproj).meta
    assert proj is not None
    assert (vision["slots"], vision["context_per_slot"]) == (2, 4096) == (
        chat["slots"], chat["context_per_slot"])  # fmt: skip
    (v_card,) = [d for d in vision["devices_detail"] if d["name"] == vision["devices"][0]]
    (c_card,) = [d for d in chat["devices_detail"] if d["name"] == chat["devices"][0]]
    assert v_card["weights"] - c_card["weights"] == proj.weight_bytes


def test_usage_errors_name_the_bad_part(models: Path) -> None:
    code, _, err = run("place", "--role", f"chat={models / 'chat.gguf'}:slots=lots")
    assert code == 2 and "slots=lots: not a whole number" in err
    code, _, err = run("place", "--role", "cook=x.gguf")
    assert code == 2 and "unknown role 'cook'" in err
    code, _, err = run("place", str(models / "chat.gguf"), "--role", f"chat={models / 'chat.gguf'}")
    assert code == 2 and "not beside it" in err
    code, _, err = run("place")
    assert code == 2 and "--role ROLE=MODEL" in err
    # a model that cannot take its role is not placed, with the reason (exit 1)
    code, doc, _ = place_json("--role", f"rerank={models / 'bge.gguf'}", "--gpu", "4GiB")
    assert code == 1
    (row,) = doc["models"]
    assert row["role"] == "rerank" and not row["placed"] and "cross-encoder" in row["reason"]


# --- exports ------------------------------------------------------------------------------------


def role_set(models: Path) -> list[str]:
    return [
        "--role", f"embed={models / 'embed.gguf'}:replicas=2",
        "--role", f"rerank={models / 'rerank.gguf'}",
        "--role", f"chat={models / 'chat.gguf'}:ctx=4096",
        "--gpu", "4GiB", "--gpu", "4GiB", "--reserve", "0", "--no-probe",
    ]  # fmt: skip


def test_the_role_set_comes_out_as_a_llama_swap_config(models: Path) -> None:
    code, out, err = run("place", *role_set(models), "--llama-swap", "-")
    assert code == 0, err
    loaded = swap_load(out, {}, windows=False)
    doc, raw = loaded["models"], loaded["doc"]
    _, placed, _ = place_json(*role_set(models)[:-1])
    want = rows(placed)
    assert set(doc) == set(want) == {"embed-1", "embed-2", "rerank", "chat"}
    for name, row in want.items():
        argv = list(doc[name]["argv"])
        expected = list(row["argv"])
        port = expected.index("--port") + 1
        assert argv[port].isdigit()  # the port llama-swap gives it
        assert argv[:port] + argv[port + 1 :] == expected[:port] + expected[port + 1 :]
    members = {m for g in raw["groups"].values() for m in g["members"]}
    assert members == set(want)  # the whole set runs together
    assert set(raw["hooks"]["on_startup"]["preload"]) == set(want)


def fake_engine(tmp_path: Path) -> Path:
    """An engine that writes its argv and port to a file named by its --port, then waits."""
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir(exist_ok=True)
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, time\n"
        "argv = sys.argv[1:]\n"
        "port = argv[argv.index('--port') + 1]\n"
        "out = os.path.join(os.environ['OUT_DIR'], port + '.json')\n"
        "open(out, 'w').write(json.dumps(argv))\n"
        "time.sleep(0.5 if port == os.environ['FIRST_PORT'] else 30)\n",
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


@pytest.mark.skipif(sys.platform == "win32" or not shutil.which("bash"), reason="bash")
def test_the_role_set_comes_out_as_a_script_that_starts_every_engine(
    models: Path, tmp_path: Path
) -> None:
    # a hostile name and path: the script must pass them to the engine as data
    hostile = tmp_path / "$(touch PWNED) `id` 'q\".gguf"
    shutil.copy(models / "chat.gguf", hostile)
    engine = fake_engine(tmp_path)
    script = tmp_path / "run.sh"
    argv = [
        "--role", f"embed={models / 'embed.gguf'}:replicas=2",
        "--role", f"chat={hostile}:ctx=4096,name=talk\n# ${{PORT}} $(id)",
        "--gpu", "4GiB", "--gpu", "4GiB", "--reserve", "0", "--no-probe",
        "--backend", str(engine),
    ]  # fmt: skip
    code, _, err = run("place", *argv, "--script", str(script))
    assert code == 0, err
    assert os.access(script, os.X_OK)
    _, doc, _ = place_json(*argv[:-2], "--backend", str(engine), "--port", "9300")
    want = {row["port"]: row["argv"][1:] for row in doc["models"]}
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = {**os.environ, "BASE_PORT": "9300", "OUT_DIR": str(out_dir), "FIRST_PORT": "9300"}
    started = time.monotonic()
    proc = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, timeout=20, check=False)
    assert time.monotonic() - started < 15  # the first engine to end ended the set
    assert proc.returncode == 0
    got = {int(p.stem): json.loads(p.read_text()) for p in out_dir.glob("*.json")}
    assert got == want  # every engine, on its own port, with the exact argv
    assert not (tmp_path / "PWNED").exists()


def test_chat_alone_takes_the_kv_cache_types_and_a_quantized_v_needs_flash(models: Path) -> None:
    code, doc, _ = place_json(
        "--role", f"chat={models / 'chat.gguf'}:ctx=4096,replicas=2",
        "--role", f"embed={models / 'bge.gguf'}",
        "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "off", "--gpu", "4GiB", "--gpu", "4GiB",
    )  # fmt: skip
    assert code == 0
    r = rows(doc)
    for name in ("chat-1", "chat-2"):
        argv = r[name]["argv"]
        assert flag(argv, "-ctk") == "q8_0" and "-ctv" not in argv  # V stays f16
        assert flag(argv, "-fa") == "off"  # the command line's -fa wins over the role's
    assert "-ctk" not in r["embed"]["argv"]  # the other roles run f16
    notes = [w for w in doc["warnings"] if "V cache stays f16" in w]
    assert len(notes) == 1 and notes[0].startswith("chat-1: ")  # once per role, not replica
