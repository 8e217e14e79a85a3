"""Roles (`core.roles`): reading `ROLE=MODEL[:KEY=VALUE,...]`, and each role's rules on models
read from synthetic GGUF files (pooling comes from their `<arch>.pooling_type` key)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gguf
import pytest

from qmgui.core.discovery import entry_for_path
from qmgui.core.footprint import Gpu, estimate
from qmgui.core.launch import LaunchSettings, resolve
from qmgui.core.meta import ModelClass, ModelMeta, Pooling
from qmgui.core.placement import AutoContext, Placed, place_stages
from qmgui.core.roles import (
    CHAT_CTX,
    CHAT_MIN_CTX,
    CHAT_SLOTS,
    EMBED_CTX,
    SLOT_SHARE,
    STAGES,
    VISION_CTX,
    RerankMode,
    Role,
    RoleError,
    RoleSpec,
    embed_pooling,
    flash_for,
    grounded_refusal,
    parse_role,
    replica_count,
    role_instances,
    role_launch,
    role_stages,
    shortfalls,
    trade_layers,
)
from tests.synth.factory import PRESETS, write_gguf

RANK = int(gguf.PoolingType.RANK)


def meta_of(tmp: Path, preset: str, **changes: object) -> ModelMeta:
    spec = replace(PRESETS[preset], **changes)  # type: ignore[arg-type]
    path = write_gguf(tmp / f"{preset}-{len(changes)}-{abs(hash(str(changes)))}.gguf", spec)
    meta = entry_for_path(path).meta
    assert meta is not None
    return meta


@pytest.fixture(scope="module")
def metas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelMeta]:
    tmp = tmp_path_factory.mktemp("roles")
    return {
        "qwen3-embed": meta_of(tmp, "qwen3-embed"),  # causal, pooling_type last
        "bert": meta_of(tmp, "bert"),  # encoder, pooling_type mean
        "bert-nopool": meta_of(tmp, "bert", pooling_type=None),  # encoder, no pooling key
        "bert-rank": meta_of(tmp, "bert", pooling_type=RANK),  # a cross-encoder
        "qwen3": meta_of(tmp, "qwen3"),  # a decoder-only LM, no pooling key
        "llama": meta_of(tmp, "llama"),
    }


# --- reading the command line -------------------------------------------------------------------


def test_a_role_with_its_keys() -> None:
    s = parse_role("chat=/m/qwen.gguf:replicas=2,ctx=16384,slots=3,name=talk,ctk=q8_0,fa=on")
    assert s == RoleSpec(Role.CHAT, "/m/qwen.gguf", replicas=2, ctx=16384, slots=3,
                         name="talk", ctk="q8_0", fa="on")  # fmt: skip
    assert parse_role("EMBED=/m/e.gguf") == RoleSpec(Role.EMBED, "/m/e.gguf")
    assert parse_role("rerank=r.gguf:replicas=auto,mode=llm").replicas is None
    assert parse_role("rerank=r.gguf:mode=cross").mode is RerankMode.CROSS


def test_a_colon_that_is_part_of_the_path_stays_in_the_path() -> None:
    assert parse_role(r"chat=C:\models\a.gguf").model == r"C:\models\a.gguf"
    assert parse_role(r"chat=C:\m\a=b.gguf").model == r"C:\m\a=b.gguf"
    s = parse_role(r"embed=C:\models\e.gguf:ctx=2048")
    assert (s.model, s.ctx) == (r"C:\models\e.gguf", 2048)
    assert parse_role("chat=/m/a:b.gguf").model == "/m/a:b.gguf"


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("chat", "write a role as ROLE=MODEL"),
        ("talk=/m/a.gguf", "unknown role 'talk'"),
        ("chat=", "names no model"),
        ("chat=/m/a.gguf:replicas=0", "replicas=0: give 1 to 64"),
        ("chat=/m/a.gguf:replicas=two", "replicas=two: not a whole number"),
        ("chat=/m/a.gguf:ctx=-5", "ctx=-5: give 1 to"),
        ("chat=/m/a.gguf:slots=", "slots= has no value"),
        ("chat=/m/a.gguf:color=red", "unknown key 'color'"),
        ("chat=/m/a.gguf:mode=llm", "mode= is for the rerank role"),
        ("rerank=/m/a.gguf:mode=fast", "mode=fast: one of cross, llm"),
        ("chat=/m/a.gguf:ctk=q9", "ctk=q9: one of"),
    ],
)
def test_errors_name_the_bad_part(text: str, names: str) -> None:
    with pytest.raises(RoleError, match=names.replace("(", r"\(")) as e:
        parse_role(text)
    assert str(e.value).startswith(repr(text))  # the whole argument, then its bad part


# --- embed ------------------------------------------------------------------------------------


def test_a_role_served_elsewhere_is_remote() -> None:
    url = parse_role("chat=remote:https://api.example.com:8443/v1")
    assert url.remote == "https://api.example.com:8443/v1"
    sdk = parse_role("rerank=remote:openai/gpt-4o-mini:name=cloud")
    assert (sdk.remote, sdk.name) == ("openai/gpt-4o-mini", "cloud")
    assert parse_role("chat=/models/remote.gguf").remote is None
    with pytest.raises(RoleError, match="remote:ENDPOINT"):
        parse_role("chat=remote:")
    with pytest.raises(RoleError, match="only name= applies"):
        parse_role("chat=remote:openai:ctx=4096")


def test_embed_pooling_comes_from_the_model(metas: dict[str, ModelMeta]) -> None:
    assert embed_pooling(metas["qwen3-embed"]) is Pooling.LAST  # its pooling_type key
    assert embed_pooling(metas["bert"]) is Pooling.MEAN
    assert metas["qwen3"].pooling is Pooling.NONE and metas["qwen3"].causal
    assert embed_pooling(metas["qwen3"]) is Pooling.LAST  # decoder-only: the last token
    assert not metas["bert-nopool"].causal
    assert embed_pooling(metas["bert-nopool"]) is Pooling.MEAN
    with pytest.raises(RoleError, match="give it the rerank role"):
        embed_pooling(metas["bert-rank"])


def test_embed_is_one_slot_with_batch_and_micro_batch_equal_to_its_context(
    metas: dict[str, ModelMeta],
) -> None:
    m = metas["qwen3-embed"]
    launch = role_launch(RoleSpec(Role.EMBED, "e"), m, backends=("cuda",))
    s = launch.settings
    assert launch.context is None and launch.max_slots is None
    assert (s.parallel, s.ctx_size, s.batch_size, s.ubatch_size) == (1, EMBED_CTX, EMBED_CTX,
                                                                      EMBED_CTX)  # fmt: skip
    assert s.flash_attn == "off"
    assert (s.cache_type_k, s.cache_type_v) == ("f16", "f16")
    assert launch.args == ("--pooling", "last")
    assert launch.meta.model_class is ModelClass.EMBEDDING
    # the engine takes a whole chunk in one micro-batch
    r = resolve(launch.meta, s, embeddings=True)
    assert r.n_ubatch == r.n_batch == EMBED_CTX
    # a context asked for is the chunk size, capped by the trained context
    short = role_launch(RoleSpec(Role.EMBED, "e", ctx=2000), m)
    assert (short.settings.ctx_size, short.settings.ubatch_size) == (2000, 2000)
    bert = role_launch(RoleSpec(Role.EMBED, "e"), metas["bert"])  # trained 512
    assert bert.settings.ubatch_size == 512 and bert.args == ("--pooling", "mean")


def test_a_decoder_without_pooling_embeds_with_last_token_pooling(
    metas: dict[str, ModelMeta],
) -> None:
    launch = role_launch(RoleSpec(Role.EMBED, "e"), metas["qwen3"])
    assert launch.args == ("--pooling", "last")
    assert launch.meta.pooling is Pooling.LAST
    assert launch.meta.model_class is ModelClass.EMBEDDING
    # the estimate sizes it in embedding mode: batch capped at the micro-batch
    fp = estimate(launch.meta, launch.settings)
    assert fp.settings.n_ubatch == launch.settings.ubatch_size


# --- rerank -----------------------------------------------------------------------------------


def test_a_cross_encoder_reranks_like_embed_with_reranking(metas: dict[str, ModelMeta]) -> None:
    launch = role_launch(RoleSpec(Role.RERANK, "r"), metas["bert-rank"], backends=("cuda",))
    assert launch.mode is RerankMode.CROSS
    assert launch.meta.model_class is ModelClass.RERANK  # the emitter writes --reranking
    assert launch.settings.parallel == 1 and launch.settings.flash_attn == "off"
    assert launch.settings.batch_size == launch.settings.ubatch_size == 512
    assert launch.args == ()


def test_a_causal_model_reranks_in_llm_mode(metas: dict[str, ModelMeta]) -> None:
    launch = role_launch(RoleSpec(Role.RERANK, "r"), metas["qwen3"], backends=("cuda",))
    assert launch.mode is RerankMode.LLM
    assert launch.meta.model_class is ModelClass.LLM  # no --reranking
    assert launch.settings.flash_attn == "on"
    assert launch.max_slots is not None and launch.max_slots > 1  # concurrent candidates
    with pytest.raises(RoleError, match="neither a cross-encoder"):
        role_launch(RoleSpec(Role.RERANK, "r"), metas["bert"])
    with pytest.raises(RoleError, match="no rank head"):
        role_launch(RoleSpec(Role.RERANK, "r", mode=RerankMode.CROSS), metas["qwen3"])


# --- chat, vision, flash attention ------------------------------------------------------------


def test_chat_grows_to_its_target_then_up_to_four_slots(metas: dict[str, ModelMeta]) -> None:
    m = metas["qwen3"]  # trained 40960
    launch = role_launch(RoleSpec(Role.CHAT, "c"), m, backends=("cuda",))
    assert launch.settings.parallel == 1
    assert launch.context == AutoContext(target=CHAT_CTX, minimum=CHAT_MIN_CTX)
    assert launch.max_slots == CHAT_SLOTS == 4
    asked = role_launch(RoleSpec(Role.CHAT, "c", ctx=99999, slots=2), m)
    assert asked.context is not None and asked.context.target == 40960  # the trained one
    assert asked.max_slots == 2
    with pytest.raises(RoleError, match="cannot chat"):
        role_launch(RoleSpec(Role.CHAT, "c"), metas["bert"])


def test_flash_attention_per_role_and_backend() -> None:
    assert flash_for(Role.CHAT, None, ("cuda", "cuda")) == "on"
    assert flash_for(Role.CHAT, None, ()) == "on"  # the CPU
    assert flash_for(Role.CHAT, None, ("metal",)) == "on"
    assert flash_for(Role.CHAT, None, ("vulkan",)) == "auto"  # the engine decides
    assert flash_for(Role.VISION, None, ("cuda", "vulkan")) == "auto"
    assert flash_for(Role.RERANK, RerankMode.LLM, ("cuda",)) == "on"
    assert flash_for(Role.RERANK, RerankMode.CROSS, ("cuda",)) == "off"
    assert flash_for(Role.EMBED, None, ("cuda",)) == "off"


def test_a_quantized_v_cache_only_where_flash_attention_is_certain(
    metas: dict[str, ModelMeta],
) -> None:
    base = LaunchSettings(cache_type_k="q8_0", cache_type_v="q8_0")
    cuda = role_launch(RoleSpec(Role.CHAT, "c"), metas["llama"], backends=("cuda",), base=base)
    assert (cuda.settings.cache_type_k, cuda.settings.cache_type_v) == ("q8_0", "q8_0")
    vk = role_launch(RoleSpec(Role.CHAT, "c"), metas["llama"], backends=("vulkan",), base=base)
    assert (vk.settings.cache_type_k, vk.settings.cache_type_v) == ("q8_0", "f16")
    assert any("V cache stays f16" in n for n in vk.notes)
    # the other roles run an f16 cache whatever chat's is
    v = role_launch(RoleSpec(Role.VISION, "v"), metas["llama"], backends=("cuda",), base=base)
    assert (v.settings.cache_type_k, v.settings.cache_type_v) == ("f16", "f16")


def test_models_llama_server_cannot_serve_are_refused(metas: dict[str, ModelMeta]) -> None:
    proj = replace(metas["llama"], model_class=ModelClass.PROJECTOR)
    with pytest.raises(RoleError, match="projector model"):
        role_launch(RoleSpec(Role.CHAT, "c"), proj)


# --- instances, stages, shortfalls ------------------------------------------------------------


def test_replicas_auto_is_one_per_card() -> None:
    auto = RoleSpec(Role.EMBED, "e", replicas=None)
    assert replica_count(auto, 3) == 3
    assert replica_count(auto, 0) == 1  # no GPU: one, in host memory
    assert replica_count(RoleSpec(Role.EMBED, "e", replicas=2), 5) == 2


def test_stages_put_search_roles_first_and_replicas_apart(metas: dict[str, ModelMeta]) -> None:
    chat = RoleSpec(Role.CHAT, "c")
    embed = RoleSpec(Role.EMBED, "e", replicas=None)
    vision = RoleSpec(Role.VISION, "v")
    launches = [
        (chat, role_launch(chat, metas["llama"])),
        (vision, role_launch(vision, metas["llama"])),
        (embed, role_launch(embed, metas["bert"])),
    ]
    insts = role_instances(launches, 2)
    assert [(i.name, i.replica) for i in insts] == [
        ("chat", 0), ("vision", 0), ("embed-1", 0), ("embed-2", 1),
    ]  # fmt: skip
    stages = role_stages(insts)
    assert [[r.name for r in s] for s in stages] == [["embed-1", "embed-2"], ["vision"], ["chat"]]
    assert STAGES[0] == (Role.EMBED, Role.RERANK)
    e1, e2 = stages[0]
    assert e1.apart is not None and e1.apart == e2.apart
    assert stages[2][0].apart is None  # one chat: nothing to keep apart
    assert stages[2][0].max_slots == CHAT_SLOTS and e1.max_slots is None


def test_chat_below_what_was_asked_is_a_warning(metas: dict[str, ModelMeta]) -> None:
    chat = RoleSpec(Role.CHAT, "c")
    (inst,) = role_instances([(chat, role_launch(chat, metas["qwen3"]))], 1)

    def placed(slots: int, ctx: int) -> Placed:
        s = replace(inst.launch.settings, parallel=slots, ctx_size=slots * ctx)
        return Placed("chat", (), (), s, estimate(inst.launch.meta, s))

    assert shortfalls(inst, placed(4, CHAT_CTX)) == []
    (slots,) = shortfalls(inst, placed(2, CHAT_CTX))
    assert f"2 slot(s) x {CHAT_CTX} tokens (asked: up to 4 x {CHAT_CTX})" in slots
    (ctx,) = shortfalls(inst, placed(1, 8192))
    assert "1 slot(s) x 8192 tokens" in ctx
    embed = RoleSpec(Role.EMBED, "e")
    (e,) = role_instances([(embed, role_launch(embed, metas["bert"]))], 1)
    assert shortfalls(e, placed(1, 256)) == []  # the warning is chat's


def test_vision_and_an_llm_reranker_grow_slots_within_half_the_card(
    metas: dict[str, ModelMeta],
) -> None:
    m = metas["llama"]
    vision = role_launch(RoleSpec(Role.VISION, "v"), m, backends=("cuda",))
    rerank = role_launch(RoleSpec(Role.RERANK, "r"), metas["qwen3"], backends=("cuda",))
    assert vision.slot_share == rerank.slot_share == SLOT_SHARE == 0.5
    assert role_launch(RoleSpec(Role.CHAT, "c"), m).slot_share is None  # all the room left
    assert role_launch(RoleSpec(Role.EMBED, "e"), metas["bert"]).slot_share is None
    asked = role_launch(RoleSpec(Role.VISION, "v", slots=2), m)
    assert asked.slot_share is None  # slots= asks for them against all the room left
    # a card that holds two full windows, where two are more than half of it: one slot
    window = vision.ctx_asked  # VISION_CTX, or the trained context below it
    assert window == min(VISION_CTX, m.context_length or VISION_CTX)
    two = replace(vision.settings, parallel=2, ctx_size=2 * window)
    need = sum(d.total for d in estimate(vision.meta, two, (Gpu("GPU0", 1 << 40),)).devices)
    card = (Gpu("GPU0", need * 6 // 5),)
    spec = RoleSpec(Role.VISION, "v")
    for launch, slots in ((asked, 2), (vision, 1)):
        stages = role_stages(role_instances([(spec, launch)], 1))
        (x,) = place_stages(stages, card, reserve=0).placed
        assert (x.footprint.settings.n_seq, x.footprint.settings.n_ctx_seq) == (slots, window)


def test_a_chat_without_room_for_a_grounded_prompt_is_refused_unless_less_was_asked(
    metas: dict[str, ModelMeta],
) -> None:
    m = metas["qwen3"]  # trained 40960
    chat = RoleSpec(Role.CHAT, "c")
    launch = role_launch(chat, m, backends=("cuda",))
    assert CHAT_MIN_CTX == 8192 and launch.context is not None
    assert launch.context.minimum == CHAT_MIN_CTX

    def need(ctx: int) -> int:
        s = replace(launch.settings, ctx_size=ctx)
        fp = estimate(launch.meta, s, (Gpu("GPU0", 1 << 40),))
        return next(d.total for d in fp.devices if d.name == "GPU0")

    # the card holds the weights and 7168 tokens of context, not 8192
    card = (Gpu("GPU0", need(7168)),)
    (inst,) = role_instances([(chat, launch)], 1)
    p = place_stages(role_stages([inst]), card, reserve=0)
    assert not p.placed
    (u,) = p.unplaced
    refused = grounded_refusal(inst, u)
    assert "holds only a 7168-token context" in refused.reason
    assert "a grounded answer needs about 8192 tokens" in refused.reason
    assert "ctx=" in refused.reason and refused.nearest == u.nearest
    # asked for less: that is the minimum, and it is served
    less = RoleSpec(Role.CHAT, "c", ctx=4096)
    (small,) = role_instances([(less, role_launch(less, m, backends=("cuda",)))], 1)
    assert small.launch.context == AutoContext(target=4096, minimum=4096)
    (x,) = place_stages(role_stages([small]), card, reserve=0).placed
    assert x.footprint.settings.n_ctx_seq == 4096
    # another role, or a chat that fits nowhere at any context, keeps its reason
    assert grounded_refusal(small, replace(u, nearest=())) == replace(u, nearest=())


def test_chat_trades_layers_for_its_window_unless_asked_or_a_speculator_head(
    metas: dict[str, ModelMeta],
) -> None:
    m = metas["qwen3"]
    chat = RoleSpec(Role.CHAT, "c")
    (inst,) = role_instances([(chat, role_launch(chat, m, backends=("cuda",)))], 1)
    s = replace(inst.launch.settings, ctx_size=7168)
    card = (Gpu("GPU0", next(d.total for d in estimate(m, s, (Gpu("GPU0", 1 << 40),)).devices
                             if d.name == "GPU0")),)  # fmt: skip
    (u,) = place_stages(role_stages([inst]), card, reserve=0).unplaced
    free = {"GPU0": card[0].total_bytes}
    traded = trade_layers(inst, u, free)
    assert traded is not None
    settings, note = traded
    assert settings.n_gpu_layers is not None and settings.n_gpu_layers < m.n_layer + 1
    assert f"to hold the {CHAT_MIN_CTX}-token window" in note
    # placed with those layers, it holds the window
    stages = [[replace(r, settings=settings) for r in st] for st in role_stages([inst])]
    (x,) = place_stages(stages, card, reserve=0).placed
    assert x.footprint.settings.n_ctx_seq >= CHAT_MIN_CTX
    # never for a speculator head, a chat given ngl=, or weights over the card's free memory
    head = replace(inst, launch=replace(inst.launch, meta=replace(m, architecture="eagle3")))
    assert trade_layers(head, u, free) is None
    pinned = replace(inst, spec=replace(chat, ngl=99))
    assert trade_layers(pinned, u, free) is None
    assert trade_layers(inst, u, {"GPU0": m.weight_bytes - 1}) is None
    assert trade_layers(inst, replace(u, nearest=()), free) is None
