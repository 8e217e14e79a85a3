"""llm_graph_context (src/llama-graph.cpp): the graph pieces every family shares: inputs,
norms, linear layers, the output head, attention over the KV cache, recurrent state reads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from qmgui.core.ggml.graph import Graph
from qmgui.core.ggml.tensor import Tensor, row_size
from qmgui.core.graph.dims import Dims, Shape

# llm_arch_supports_mixed_batch (src/llama-arch.cpp): the architectures without the branch
_NO_MIXED_BATCH = frozenset(
    {"cogvlm", "deepseek4", "graniteswitch", "eagle3", "dflash", "gemma4-assistant"}
)


class Builder:
    """llm_graph_context: inputs, norms, attention and FFN blocks, output head."""

    def __init__(self, d: Dims, s: Shape) -> None:
        self.d = d
        self.s = s
        self.g = Graph()
        self.n_tokens = s.n_tokens
        self._pos: Tensor | None = None
        self._out_ids: Tensor | None = None
        self._attn_inputs: dict[str, AttnInputs] = {}
        self.no_cache_mask: Tensor | None = None
        self._s_copy: tuple[Tensor, Tensor] | None = None
        # build_inp_embd as of core.compute.MIXED_BATCH_BUILD (set by compute._mixed_batch's
        # wrapper of a family)
        self.mixed_batch = False
        self.t_embd: Tensor | None = None  # the output head's input (res->t_embd)
        # recurrent state slots build_rs reads (0: one per sequence of the ubatch); a family
        # that reserves its prompt graph with fewer sequences than slots sets it
        self.rs_slots = 0

    def each_layer(self) -> Iterator[int]:
        """The replayed layers in order; weights and caches built meanwhile are stamped with
        their layer, those built after the last one with the output layer's index."""
        for il in self.d.layers:
            self.g.layer = il
            yield il
        self.g.layer = self.d.n_layer

    # -- inputs -----------------------------------------------------------------------------

    def inp_embd(self, *, scale: bool = False, tok_scale: bool = False) -> Tensor:
        """build_inp_embd: token rows, plus the unused vector-embedding input (a leaf that is
        allocated and never freed); Granite scales the rows here.

        From MIXED_BATCH_BUILD on (`self.mixed_batch`, architectures that allow mixed
        token/embedding batches) a third select branch is built and allocated, though unused:
        its own token, slot (i64) and embedding inputs, the token rows (get_rows), a copy of
        the embedding input (dup) and set_rows into that copy. The set_rows result is a view
        of the copy that nothing reads, so ggml-alloc never frees the copy: n_embd x n_tokens
        f32 stays allocated for the whole graph, next to the three inputs. `tok_scale`: the
        token rows are scaled in here (Gemma 3 from that build on, sqrt(n_embd)): an
        [1, n_tokens] f32 input and a mul, in place; older builds scale in the model."""
        g, d = self.g, self.d
        tokens = g.input("i32", self.n_tokens)
        tok_embd = g.weight(d.n_embd, d.n_vocab)
        embd = g.get_rows(tok_embd, tokens)
        g.expand(embd)
        g.expand(g.input("f32", d.n_embd, self.n_tokens))
        mixed = self.mixed_batch and d.arch not in _NO_MIXED_BATCH
        if mixed:
            rows = g.get_rows(tok_embd, g.input("i32", self.n_tokens))
            slots = g.input("i64", self.n_tokens)
            copy = g.op("dup", g.input("f32", d.n_embd, self.n_tokens))
            g.expand(g.set_rows(copy, rows, slots))
        if scale:
            embd = g.expand(g.op("scale", embd))
        if tok_scale:
            if self.mixed_batch:
                embd = g.expand(g.op("mul", embd, g.input("f32", 1, self.n_tokens)))
            else:
                embd = g.op("scale", embd)
        return embd

    def inp_pos(self, per_token: int = 1) -> Tensor:
        """build_inp_pos: `per_token` positions per token (4 under M-RoPE / IMRoPE:
        llama_hparams::n_pos_per_embd); the first call sizes the input."""
        if self._pos is None:
            self._pos = self.g.input("i32", self.n_tokens * per_token)
        return self._pos

    def out_ids(self) -> Tensor:
        if self._out_ids is None:
            self._out_ids = self.g.input("i32", self.s.n_outputs)
        return self._out_ids

    # -- small blocks -----------------------------------------------------------------------

    def norm(
        self, x: Tensor, weight: bool = True, *, kind: str = "rms_norm", bias: bool = False
    ) -> Tensor:
        """build_norm: rms_norm (or layer norm), times the weight, plus the bias."""
        g = self.g
        cur = g.op(kind, x)
        if weight:
            cur = g.op("mul", cur, g.weight(x.ne[0]))
        if bias:
            cur = g.op("add", cur, g.weight(x.ne[0]))
        return cur

    def linear(self, x: Tensor, n_out: int, bias: bool = False) -> Tensor:
        g = self.g
        cur = g.mul_mat(g.weight(x.ne[0], n_out), x)
        if bias:
            cur = g.op("add", cur, g.weight(n_out))
        return cur

    def rope(self, x: Tensor) -> Tensor:
        return self.g.op("rope", x, self.inp_pos())

    def last_rows(self, il: int, *xs: Tensor) -> list[Tensor]:
        """The last layer keeps only the rows that reach the output head (inp_out_ids)."""
        if il != self.d.n_layer - 1:
            return list(xs)
        return [self.g.get_rows(x, self.out_ids()) for x in xs]

    def ffn(self, x: Tensor, n_ff: int, *, act: str = "swiglu", gate: bool = True) -> Tensor:
        """build_ffn with a parallel gate: gate and up matmuls, fused GLU, down matmul."""
        g = self.g
        up = self.linear(x, n_ff)
        cur = g.op(act, self.linear(x, n_ff), up) if gate else g.op("unary", up)
        return self.linear(cur, x.ne[0])

    def output_head(
        self,
        cur: Tensor,
        *,
        keep_hidden: bool = False,
        logit_scale: bool = False,
        norm_is_output: bool = False,
        softcap: bool = False,
        kind: str = "rms_norm",
    ) -> Tensor:
        """result_norm and result_output are graph outputs: never freed, never reused.
        `keep_hidden`: the last layer's output is itself a graph output (t_h_nextn) and the
        output rows are selected only here; `norm_is_output`: the same, after the norm."""
        g = self.g
        if keep_hidden:
            cur.is_output = True
            cur = g.get_rows(cur, self.out_ids())
        cur = self.norm(cur, kind=kind, bias=kind == "norm")
        if norm_is_output:
            cur.is_output = True
            cur = g.get_rows(cur, self.out_ids())
        cur.is_output = True
        self.t_embd = cur
        logits = g.mul_mat(g.weight(self.d.n_embd, self.d.n_vocab), cur)
        if self.d.has("output.bias"):  # result_output_no_bias + output_b (in place)
            logits = g.op("add", logits, g.weight(self.d.n_vocab))
        if logit_scale:
            logits = g.op("scale", logits)
        if softcap:  # final logit soft-capping: scale, tanh, scale
            logits = g.op("scale", g.op("unary", g.op("scale", logits)))
        logits.is_output = True
        g.expand(logits)
        return logits

    # -- attention (build_attn / build_attn_mha) --------------------------------------------

    def kv_inputs(self, swa: bool) -> AttnInputs:
        """build_attn_inp_kv(_iswa): KV write indices, the KQ mask, Hadamard rotations; one
        set per KV cache, shared by its layers."""
        key = "swa" if swa else "full"
        have = self._attn_inputs.get(key)
        if have is not None:
            return have
        d, g, n = self.d, self.g, self.n_tokens
        n_kv = d.n_kv_swa if swa else d.n_kv
        k_idxs = g.input("i64", n)
        # a transposed V (no flash attention) is written one element per row
        v_idxs = g.input("i64", n if d.flash_attn else n * d.n_embd_v_gqa_max)
        n_mask_streams = 1 if d.unified else self.s.n_seqs
        mask = g.input(
            "f16" if d.flash_attn else "f32", n_kv, n // n_mask_streams, 1, n_mask_streams
        )
        rot_k = g.input("f32", d.rot_k, d.rot_k) if d.rot_k else None
        rot_v = g.input("f32", d.rot_v, d.rot_v) if d.rot_v else None
        made = AttnInputs(n_kv, k_idxs, v_idxs, mask, rot_k, rot_v)
        self._attn_inputs[key] = made
        return made

    def is_recurrent(self, il: int) -> bool:
        r = self.d.recurrent_layers
        return il < len(r) and r[il]

    def rs(self, state_size: int, get_rows: RowsFn | None = None) -> Tensor:
        """build_rs: read this ubatch's recurrent states from the layer's state cache. The
        first slot is zeroed in place, the sequences' rows gathered (or handed to a scan op
        that reads them itself), the other slots copied back; all but the gather are views."""
        g = self.g
        n_seqs = self.s.n_seqs
        # recurrent memory holds one state per slot (n_rs_seq = 0)
        n_rs = self.rs_slots or max(1, n_seqs)
        if self._s_copy is None:  # build_rs_inp: one index input and its two views
            s_copy = g.input("i32", n_rs)
            self._s_copy = (g.view(s_copy, (n_seqs,)), g.view(s_copy, (n_rs - n_seqs,)))
        main, extra = self._s_copy
        if self.mixed_batch:
            return self._rs_gathered(state_size, get_rows)
        cache = g.cache("f32", state_size, n_rs)
        states = g.reshape(cache, state_size, n_rs)
        zero = g.view(states, (state_size,))
        g.expand(Tensor(zero.type, zero.ne, op="scale", src=(zero,), view_src=zero, nb=zero.nb))
        out = get_rows(states, main) if get_rows else g.get_rows(states, main)
        g.expand(out)
        rest = g.get_rows(states, extra)
        g.expand(g.cpy(rest, g.view(cache, (state_size, n_rs - n_seqs))))
        return out

    def _rs_gathered(self, state_size: int, get_rows: RowsFn | None) -> Tensor:
        """build_rs as of MIXED_BATCH_BUILD (b11434 src/llama-graph.cpp build_rs): one
        gather of every state (rs_s_copy, n_rs rows) whose first n_seqs rows are the
        ubatch's states (a view) and whose rest is copied back; a custom getter (the scan
        ops) reads the ubatch's states itself and the gather takes the n_rs - 1 others
        (s_copy_tail), allocated after the scan and freed by the copy."""
        g = self.g
        n_seqs = self.s.n_seqs
        n_rs = self.rs_slots or max(1, n_seqs)
        assert self._s_copy is not None
        main = self._s_copy[0]
        s_copy = main.view_src
        assert s_copy is not None
        cache = g.cache("f32", state_size, n_rs)
        states = g.reshape(cache, state_size, n_rs)
        zero = g.view(states, (state_size,))
        g.expand(Tensor(zero.type, zero.ne, op="scale", src=(zero,), view_src=zero, nb=zero.nb))
        idx = g.view(s_copy, (n_rs - 1,)) if get_rows else s_copy
        gathered = g.get_rows(states, idx)
        if get_rows:
            out = get_rows(states, main)
        else:
            out = g.view(gathered, (state_size, n_seqs), (gathered.nb[1],))
        g.expand(out)
        rest = g.view(gathered, (state_size, n_rs - n_seqs), (gathered.nb[1],))
        g.expand(g.cpy(rest, g.view(cache, (state_size, n_rs - n_seqs))))
        return out

    def hadamard(self, x: Tensor, rot: Tensor) -> Tensor:
        """llama_mul_mat_hadamard: rotate rows in blocks of rot.ne[0] (quantized KV cache)."""
        g = self.g
        n = rot.ne[0]
        rows = x.nelements // n
        cur = g.cont(x, n, rows) if not x.is_contiguous() else g.reshape(x, n, rows)
        return g.reshape(g.mul_mat(rot, cur), *x.ne)

    def attn_kv(
        self,
        il: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        sinks: bool = False,
        softcap: bool = False,
        wo_bias: bool = False,
        wo: bool = True,
        mask: Tensor | None = None,
    ) -> Tensor:
        """build_attn with a KV cache: rotate, store K and V, attend over the whole cache
        (the sliding-window cache for SWA layers), project with wo. `mask`: a KQ mask the
        model built in place of the cache's (qwen4exp's sparse selection, same shape)."""
        g, d = self.g, self.d
        swa = d.is_swa(il)
        inp = self.kv_inputs(swa)
        if inp.rot_k is not None:
            q = self.hadamard(q, inp.rot_k)
            k = self.hadamard(k, inp.rot_k)
        if inp.rot_v is not None:
            v = self.hadamard(v, inp.rot_v)
        # the iSWA variant expands q, k, v; the plain one q, v, k (rope fusion into the cache)
        for t in (q, k, v) if d.iswa else (q, v, k):
            g.expand(t)
        kc, vc = self._cache_tensors(il, inp.n_kv)
        g.expand(self.store_k(kc, k, inp.k_idxs))
        g.expand(self._store_v(vc, v, inp.v_idxs))
        kview, vview = self.cache_views(il, kc, vc, inp.n_kv)
        kq_mask = inp.mask if mask is None else mask
        cur = self.attn_mha(q, kview, vview, kq_mask, sinks=sinks, softcap=softcap)
        if inp.rot_v is not None:
            cur = self.hadamard(cur, inp.rot_v)
        return self.linear(cur, d.n_embd, bias=wo_bias) if wo else cur

    def _cache_tensors(self, il: int, n_kv: int) -> tuple[Tensor, Tensor]:
        d = self.d
        n_k = d.head_k * d.n_head_kv[il]
        n_v = d.head_v * d.n_head_kv[il] if d.flash_attn else d.n_embd_v_gqa_max
        kc = self.g.cache(d.type_k, n_k, n_kv, d.n_stream)
        vc = self.g.cache(d.type_v, n_v, n_kv, d.n_stream)
        return kc, vc

    def store_k(self, kc: Tensor, k: Tensor, idxs: Tensor) -> Tensor:
        """llama_kv_cache::cpy_k: rows of K into the cache (a view, allocates nothing)."""
        g = self.g
        n_gqa = k.ne[0] * k.ne[1]
        rows = g.view(k, (n_gqa, k.ne[2]), (k.nb[2],))
        dst = g.reshape(kc, kc.ne[0], kc.ne[1] * kc.ne[2]) if kc.ne[2] > 1 else kc
        return g.set_rows(dst, rows, idxs)

    def _store_v(self, vc: Tensor, v: Tensor, idxs: Tensor) -> Tensor:
        """llama_kv_cache::cpy_v: rows, or single elements when V is stored transposed."""
        g = self.g
        n_gqa = v.ne[0] * v.ne[1]
        if self.d.flash_attn:
            rows = g.view(v, (n_gqa, v.ne[2]), (v.nb[2],))
            dst = g.reshape(vc, vc.ne[0], vc.ne[1] * vc.ne[2]) if vc.ne[2] > 1 else vc
            return g.set_rows(dst, rows, idxs)
        cur = g.reshape(v, n_gqa, v.ne[2]) if v.is_contiguous() else g.cont(v, n_gqa, v.ne[2])
        if n_gqa < vc.ne[0]:
            cur = g.op("pad", cur, ne=(vc.ne[0], cur.ne[1]))
        dst = g.reshape(vc, 1, vc.nelements)
        return g.set_rows(dst, g.reshape(cur, 1, cur.nelements), idxs)

    def cache_views(self, il: int, kc: Tensor, vc: Tensor, n_kv: int) -> tuple[Tensor, Tensor]:
        """get_k / get_v: [head, n_head_kv, n_kv, n_stream] (V transposed without FA)."""
        d, g = self.d, self.g
        hkv = d.n_head_kv[il]
        ns = d.n_stream
        kv_size = kc.ne[1]
        tk = kc.type
        k = g.view(
            kc,
            (d.head_k, hkv, n_kv, ns),
            (row_size(tk, d.head_k), row_size(tk, kc.ne[0]), row_size(tk, kc.ne[0] * kv_size)),
        )
        tv = vc.type
        if d.flash_attn:
            v = g.view(
                vc,
                (d.head_v, hkv, n_kv, ns),
                (
                    row_size(tv, d.head_v),
                    row_size(tv, vc.ne[0]),
                    row_size(tv, vc.ne[0] * kv_size),
                ),
            )
        else:
            v = g.view(
                vc,
                (n_kv, hkv, d.head_v, ns),
                (
                    row_size(tv, kv_size * d.head_v),
                    row_size(tv, kv_size),
                    row_size(tv, kv_size * vc.ne[0]),
                ),
            )
        return k, v

    def attn_mha(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor,
        *,
        sinks: bool = False,
        softcap: bool = False,
        v_mla: Tensor | None = None,
    ) -> Tensor:
        """build_attn_mha: flash attention, or KQ -> soft-max (in place) -> KQV."""
        g = self.g
        v_trans = v.nb[1] > v.nb[2]
        ns = k.ne[3]
        q = g.view(
            q, (q.ne[0], q.ne[1], q.ne[2] // ns, ns), (q.nb[1], q.nb[2], q.nb[2] * (q.ne[2] // ns))
        )
        q = g.permute(q, 0, 2, 1, 3)
        k = g.permute(k, 0, 2, 1, 3)
        v = g.permute(v, 0, 2, 1, 3)
        if self.d.flash_attn:
            if k.type == "f32":
                k = g.op("cpy", k, type_="f16")
            if v.type == "f32":
                v = g.op("cpy", v, type_="f16")
            extra = (g.weight(q.ne[2]),) if sinks else ()
            cur = Tensor(
                "f32",
                (v.ne[0], q.ne[2], q.ne[1], q.ne[3]),
                op="flash_attn_ext",
                src=(q, k, v, mask, *extra),
            )
            if v_mla is not None:
                cur = g.permute(cur, 0, 2, 1, 3)
                cur = g.mul_mat(v_mla, cur)
                cur = g.permute(cur, 0, 2, 1, 3)
                cur = g.cont(cur)
            cur = g.reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = g.mul_mat(k, q)
            if softcap:
                kq = g.op("unary", g.op("scale", kq))
                kq = g.op("scale", kq)
            extra = (g.weight(q.ne[2]),) if sinks else ()
            kq = g.op("soft_max", kq, mask, *extra)
            if not v_trans:
                v = g.cont(g.transpose(v))
            kqv = g.mul_mat(v, kq)
            if v_mla is not None:
                kqv = g.mul_mat(v_mla, kqv)
            cur = g.permute(kqv, 0, 2, 1, 3)
            cur = g.cont(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        g.expand(cur)
        return cur


RowsFn = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class AttnInputs:
    n_kv: int
    k_idxs: Tensor
    v_idxs: Tensor
    mask: Tensor
    rot_k: Tensor | None
    rot_v: Tensor | None


def pre_norm(b: Builder, x: Tensor, name: str) -> Tensor:
    """RMS norm, or a layer norm with bias where the GGUF carries one."""
    if b.d.has(name + ".bias"):
        return b.norm(x, kind="norm", bias=True)
    return b.norm(x)


# a family's graph function (core.models): lays its graph out on the builder
Build = Callable[[Builder], None]
