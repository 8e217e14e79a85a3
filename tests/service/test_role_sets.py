"""`service.role_sets.plan_role_set`: a role set (the window's and `qmgui place --role`'s) planned
on what-if cards or in host memory, each instance with its name, role, replica, port and argv;
library ids found through `find`; a bad line named."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from qmgui.core.discovery import entry_for_path
from qmgui.core.roles import EMBED_CTX, RoleError
from qmgui.hw.profiles import lookup
from qmgui.service.role_sets import NotInstalled, RoleSetOptions, check_roles, plan_role_set
from qmgui.settings import LoadResult, Settings
from tests.synth.factory import PRESETS, write_gguf

NO_BACKENDS = LoadResult(Settings())  # the engine by its usual name: no registry, no probe


@pytest.fixture
def models(tmp_path: Path) -> Path:
    write_gguf(tmp_path / "chat.gguf", PRESETS["qwen3"])
    write_gguf(tmp_path / "embed.gguf", PRESETS["qwen3-embed"])
    return tmp_path


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_two_roles_on_two_what_if_cards(models: Path) -> None:
    gpus = tuple(replace(g, name=f"GPU{i}") for i, g in enumerate(lookup("2x8GiB")))
    opts = RoleSetOptions(gpus=gpus, probe=False)
    roles = [f"chat={models / 'chat.gguf'}:ctx=4096", f"embed={models / 'embed.gguf'}:replicas=2"]
    plan = plan_role_set(roles, opts, lambda i: 9100 + i, loaded=NO_BACKENDS)
    assert plan.fits and not plan.unplaced
    by_name = {i.name: i for i in plan.instances}
    assert list(by_name) == ["embed-1", "embed-2", "chat"]  # the search roles first
    assert [(i.role, i.replica, i.replicas) for i in plan.instances] == [
        ("embed", 0, 2),
        ("embed", 1, 2),
        ("chat", 0, 1),
    ]
    assert [i.port for i in plan.instances] == [9100, 9101, 9102]
    for inst in plan.instances:
        assert flag(inst.argv, "--port") == str(inst.port)
        assert inst.argv[0].endswith("llama-server") and len(inst.devices) == 1
    assert by_name["embed-1"].devices != by_name["embed-2"].devices  # replicas apart
    embed = by_name["embed-1"].argv
    assert "--embedding" in embed and flag(embed, "-c") == str(EMBED_CTX)
    chat = by_name["chat"].argv
    assert "--embedding" not in chat and flag(chat, "-np") == "4"


def test_host_memory_and_library_ids(models: Path) -> None:
    """No GPU: the instances go to host memory; a role may name a library id (`find`)."""
    chat = entry_for_path(models / "chat.gguf")
    library = {"lib:chat": chat}
    opts = RoleSetOptions(host_bytes=8 << 30, probe=False)
    roles = ["chat=lib:chat:ctx=2048,slots=1", f"embed={models / 'embed.gguf'}"]
    plan = plan_role_set(roles, opts, lambda i: 9200 + i, find=library.get, loaded=NO_BACKENDS)
    assert plan.fits
    (embed, served) = plan.instances
    assert served.model == "lib:chat" and served.entry.path == chat.path
    assert served.devices == () and embed.devices == ()
    assert "--device" not in served.argv  # no GPU refused: nothing to pin
    assert (flag(served.argv, "-c"), flag(served.argv, "-np")) == ("2048", "1")
    # every GPU refused: the instances in host memory say --device none
    pinned = plan_role_set(
        roles, RoleSetOptions(host_bytes=8 << 30, probe=False, device_none=True),
        lambda i: 9200 + i, find=library.get, loaded=NO_BACKENDS,
    )  # fmt: skip
    assert all(flag(i.argv, "--device") == "none" for i in pinned.instances)


def test_what_cannot_be_planned_is_named(models: Path) -> None:
    with pytest.raises(RoleError, match="unknown role 'talk'"):
        check_roles(["talk=x.gguf"])
    with pytest.raises(RoleError, match="at least one role"):
        check_roles(["", "  "])
    (models / "bad.gguf").write_bytes(b"not a gguf")
    plan = plan_role_set(
        [
            f"chat={models / 'chat.gguf'}:ctx=2048",
            f"embed={models / 'missing.gguf'}",
            f"rerank={models / 'bad.gguf'}",
        ],
        RoleSetOptions(host_bytes=8 << 30, probe=False),
        lambda i: 9300 + i,
        loaded=NO_BACKENDS,
    )
    assert [i.name for i in plan.instances] == ["chat"] and not plan.fits
    # a model that is not installed is reported apart from one that cannot be placed
    assert plan.not_installed == (NotInstalled("embed", "embed", str(models / "missing.gguf")),)
    assert f"embed: {models / 'missing.gguf'} is not installed" in plan.warnings[0]
    (bad,) = plan.unplaced
    assert bad.name == "rerank" and bad.reason
    # a library id that the library has is installed, one that it lacks is not
    chat = entry_for_path(models / "chat.gguf")
    found = plan_role_set(
        ["chat=lib:chat", "embed=lib:gone"],
        RoleSetOptions(host_bytes=8 << 30, probe=False),
        lambda i: 9400 + i,
        find={"lib:chat": chat}.get,
        loaded=NO_BACKENDS,
    )
    assert [i.name for i in found.instances] == ["chat"]
    assert [m.model for m in found.not_installed] == ["lib:gone"] and not found.unplaced


def test_a_remote_role_is_listed_and_never_started(models: Path) -> None:
    gpus = tuple(replace(g, name=f"GPU{i}") for i, g in enumerate(lookup("2x8GiB")))
    opts = RoleSetOptions(gpus=gpus, probe=False)
    roles = [f"embed={models / 'embed.gguf'}", "chat=remote:openai/gpt-4o:name=cloud"]
    plan = plan_role_set(roles, opts, lambda i: 9300 + i, loaded=NO_BACKENDS)
    assert plan.fits and [i.name for i in plan.instances] == ["embed"]
    assert [(r.name, r.role, r.endpoint) for r in plan.remote] == [
        ("cloud", "chat", "openai/gpt-4o")
    ]
