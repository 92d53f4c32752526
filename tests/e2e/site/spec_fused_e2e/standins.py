"""CPU stand-ins for what SGLang 0.5.23's engine lacks on a CPU with no ``sgl_kernel``
build. Test tier only. Each says why in one line; none touches the relay's logic, the
FutureMap, or anything ``spec_fused.integration.code_check`` fingerprints: a stand-in
that changed what the relay sees would make the tier worthless.
"""

from __future__ import annotations

import contextlib
import os
import zlib

DUMMY_SCALE = float(os.environ.get("SPEC_FUSED_E2E_WEIGHT_SCALE", "0.08"))
STANDINS: list = []  # installed in this order by install()


def _standin(fn):
    STANDINS.append(fn)
    return fn


@_standin
def overlap_on_cpu():
    """Upstream turns overlap off for speculative decoding on CPU ("not implemented"): lift
    it, or spec v2's FutureMap relay never runs here."""
    from sglang.srt.arg_groups import speculative_hook

    speculative_hook._disable_overlap_schedule_for_cpu = lambda server_args: None


@_standin
def dflash_on_cpu():
    """The CPU platform refuses DFLASH by device name: answer "supported" for DFLASH (and its
    draft attention backend) while SGLang checks its server arguments."""
    from sglang.srt.arg_groups import speculative_hook

    handle = speculative_hook._handle_dflash
    resolve_backend = speculative_hook._resolve_dflash_draft_attention_backend

    class Platform:
        def __init__(self, real):
            self._real = real

        def __getattr__(self, name):
            return getattr(self._real, name)

        def is_out_of_tree(self):
            return True

        def supports_speculative_algorithm(self, algorithm):
            return algorithm == "DFLASH" or self._real.supports_speculative_algorithm(algorithm)

        def supports_speculative_draft_attention_backend(self, algorithm, backend):
            return backend == "triton"

        def get_default_speculative_draft_attention_backend(self, algorithm):
            return "triton"

    @contextlib.contextmanager
    def as_supported():
        real = speculative_hook.current_platform
        speculative_hook.current_platform = Platform(real)
        try:
            yield
        finally:
            speculative_hook.current_platform = real

    def handle_dflash(server_args):
        with as_supported():
            return handle(server_args)

    def resolve_dflash_backend(server_args):
        with as_supported():
            return resolve_backend(server_args)

    speculative_hook._handle_dflash = handle_dflash
    speculative_hook._resolve_dflash_draft_attention_backend = resolve_dflash_backend


@_standin
def deterministic_dummy_weights():
    """SGLang's dummy weights, U(+-1e-3) from one seed for every tensor of a shape, collapse
    every output into a 2-token cycle: seed per parameter name, scale up. Then the drafts
    are made to accept (``_drafts_that_accept``) and a target's ``spec_fused_e2e`` config
    entry is applied (``_target_as_configured``)."""
    import torch
    from sglang.srt.model_loader import loader

    def init(model, low=None, high=None, seed=1234):
        params = model.state_dict()
        for name, param in params.items():
            if not torch.is_floating_point(param):
                continue
            gen = torch.Generator(device="cpu").manual_seed(seed ^ zlib.crc32(name.encode()))
            if name.endswith("norm.weight"):
                values = torch.ones(param.shape)  # a norm then never changes an argmax
            else:
                values = (torch.rand(param.shape, generator=gen) * 2 - 1) * DUMMY_SCALE
            param.data.copy_(values.to(param.dtype))
        _target_as_configured(model, params)
        _drafts_that_accept(model, params)

    loader.initialize_dummy_weights = init


def _rotation(n: int):
    """A fixed orthogonal n x n matrix: ``_target_as_configured``'s head and DFLASH's
    draft share it."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(29)
    return torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float32))[0]


def _target_as_configured(model, params) -> None:
    """A target whose config.json has ``spec_fused_e2e`` (``models.py``): its
    ``passthrough_layers`` add nothing to the residual stream (so an aux hidden state
    captured before them is the final one); its ``zero_embedding_rows`` embed to 0 (DFLASH's
    mask token: a block's mask rows then carry nothing of their own); with
    ``head_rotates_embedding`` its head is its embedding turned by a fixed rotation R
    (``lm_head = E R^T``), so ``R x`` scores highest for the token whose embedding x is
    (DFLASH's draft uses that), while the target does not simply repeat its input token,
    as a head tied to the embedding would."""
    spec = getattr(model.config, "spec_fused_e2e", None)
    if not spec:
        return
    for layer in spec.get("passthrough_layers", ()):
        for part in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            params[f"model.layers.{layer}.{part}"].zero_()
    embed = params["model.embed_tokens.weight"]
    if embed.shape[0] != model.config.vocab_size:
        raise NotImplementedError("spec_fused_e2e: a sharded embedding (TP) has no stand-in")
    for row in spec.get("zero_embedding_rows", ()):
        embed[row].zero_()
    if spec.get("head_rotates_embedding"):
        rotation = _rotation(embed.shape[1])
        params["lm_head.weight"].copy_((embed.float() @ rotation.T).to(embed.dtype))


def _drafts_that_accept(model, params) -> None:
    """Random drafts never agree with the target, so every step would accept nothing and
    every published length would be seq_len + 1. Each draft below proposes the token the
    target just produced, so it is accepted wherever the target repeats itself, and
    acceptance varies per request and per step. (STANDALONE's draft is the target's first
    layers, seeded by the same names: it agrees where those layers already decide.)

    * EAGLE: ``fc(cat(embeds, hidden)) = hidden`` and the layer adds nothing: the draft
      head reads the target's last hidden state.
    * EAGLE3: ``fc`` keeps the last captured aux hidden state, which is the target's final
      one (its later layers pass through), and the layer adds nothing.
    * DFLASH: q = k = 0, so every block row attends uniformly over the context and the
      block; the context's features are 0 (``fc`` = 0) and so is the mask token's
      embedding, so each mask row's output is R times the bonus token's normalised
      embedding, which the target's head (``E R^T``) maps back to the bonus token."""
    import torch

    kind = type(model).__name__
    if kind in ("LlamaForCausalLMEagle", "LlamaForCausalLMEagle3"):
        for name, param in params.items():
            if name.endswith(("o_proj.weight", "down_proj.weight", "fc.bias")):
                param.zero_()
            elif name.endswith("fc.weight"):  # the input's last hidden-size slice
                h = param.shape[0]
                param.zero_()
                param[:, -h:] = torch.eye(h, dtype=param.dtype)
    elif kind == "DFlashDraftModel":
        for name, param in params.items():
            if name.endswith(("down_proj.weight", "fc.weight")):
                param.zero_()
            elif name.endswith("o_proj.weight"):
                param.copy_(_rotation(param.shape[0]).to(param.dtype))
            elif name.endswith("qkv_proj.weight"):  # [q; k; v]: q = k = 0, v = x
                h = param.shape[1]
                param.zero_()
                param[-h:] = torch.eye(h, dtype=param.dtype)


@_standin
def record_stream_on_cpu():
    """DFLASH calls Tensor.record_stream on the current stream, which raises for a CPU
    stream: a CPU tensor has no allocator stream to record, so it is a no-op there."""
    import torch

    original = torch.Tensor.record_stream

    def record_stream(self, stream):
        if self.device.type == "cpu":
            return None
        return original(self, stream)

    torch.Tensor.record_stream = record_stream


def _attend(q, k, v, mask, sm_scale, k_scale, v_scale):
    """q (M, H, D) over k, v (N, Hk, D) with a (M, N) bool mask, GQA by head groups."""
    import torch

    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1) * float(k_scale)
    v = v.float().repeat_interleave(group, dim=1) * float(v_scale)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k) * sm_scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hmn,nhd->mhd", torch.softmax(scores, dim=-1), v)


_KERNEL_DEFAULTS = {
    "logit_cap": 0.0,
    "sliding_window_size": -1,
    "xai_temperature_len": -1,
    "page_size": 1,
    "skip_prefix": False,
    "skip_extend": False,
    "has_mla": False,
}  # any other argument checked here defaults to None


def _no_extras(name, **given):
    """The plain-torch twins implement the plain case only: anything else raises, named."""
    for key, value in given.items():
        if value is not None and value != _KERNEL_DEFAULTS.get(key):
            raise NotImplementedError(f"{name}: {key}={value!r} has no stand-in in the e2e tier")


@_standin
def attention_kernels_in_torch():
    """SGLang's Triton attention kernels take ~0.4 s a layer in the Triton interpreter: the
    same math (extend/verify with causal or custom mask, decode) in plain torch."""
    import torch
    from sglang.kernels.ops.attention import decode_attention, extend_attention
    from sglang.srt.speculative import eagle_utils

    def extend_attention_fwd(
        q_extend,
        k_extend,
        v_extend,
        o_extend,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        custom_mask,
        is_causal,
        mask_indptr,
        max_len_extend,
        k_scale,
        v_scale,
        sm_scale=None,
        logit_cap=0.0,
        skip_prefix_custom_mask=True,
        sliding_window_size=-1,
        sinks=None,
        window_kv_offsets=None,
        xai_temperature_len=-1,
        lse_extend=None,
        skip_prefix=False,
        skip_extend=False,
        page_size=1,
        score_mod=None,
        aux_tensors=None,
        extend_seq_lens_cpu=None,
        identity_kv_indices=False,
    ):
        _no_extras(
            "extend_attention_fwd",
            logit_cap=logit_cap,
            sliding_window_size=sliding_window_size,
            sinks=sinks,
            window_kv_offsets=window_kv_offsets,
            xai_temperature_len=xai_temperature_len,
            lse_extend=lse_extend,
            skip_prefix=skip_prefix,
            skip_extend=skip_extend,
            page_size=page_size,
            score_mod=score_mod,
        )
        sm_scale = sm_scale or 1.0 / (q_extend.shape[-1] ** 0.5)
        qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
        masks = mask_indptr.tolist() if custom_mask is not None else None
        # On CPU, SGLang writes the verify tree mask as qlen x qlen per request
        # (QLEN_ONLY, what its intel_amx kernel reads), not the GPU kernels' full rows.
        qlen_only = eagle_utils.default_tree_mask_mode() == eagle_utils.TreeMaskMode.QLEN_ONLY
        qlen_at = 0
        for i in range(len(qo) - 1):
            qs, qe = qo[i], qo[i + 1]
            m = qe - qs
            if m == 0:
                continue
            idx = kv_indices[kv[i] : kv[i + 1]].long()
            p = idx.numel()
            k = torch.cat([k_buffer[idx], k_extend[qs:qe]])
            v = torch.cat([v_buffer[idx], v_extend[qs:qe]])
            mask = torch.ones(m, p + m, dtype=torch.bool)
            if custom_mask is not None and qlen_only:
                mask[:, p:] = custom_mask[qlen_at : qlen_at + m * m].view(m, m).bool()
                qlen_at += m * m
            elif custom_mask is not None:
                full = custom_mask[masks[i] : masks[i] + m * (p + m)].view(m, p + m).bool()
                if skip_prefix_custom_mask:
                    mask[:, p:] = full[:, p:]
                else:
                    mask = full
            elif is_causal:
                mask[:, p:] = torch.ones(m, m, dtype=torch.bool).tril()
            o_extend[qs:qe] = _attend(q_extend[qs:qe], k, v, mask, sm_scale, k_scale, v_scale).to(
                o_extend.dtype
            )

    def decode_attention_fwd(
        q,
        k_buffer,
        v_buffer,
        o,
        kv_indptr,
        kv_indices,
        attn_logits,
        attn_lse,
        num_kv_splits,
        max_kv_splits,
        sm_scale,
        k_scale,
        v_scale,
        logit_cap=0.0,
        sinks=None,
        xai_temperature_len=-1,
        has_mla=False,
        page_size=1,
        score_mod=None,
        **ignored,
    ):
        _no_extras(
            "decode_attention_fwd",
            logit_cap=logit_cap,
            sinks=sinks,
            xai_temperature_len=xai_temperature_len,
            has_mla=has_mla,
            page_size=page_size,
            score_mod=score_mod,
        )
        kv = kv_indptr.tolist()
        for i in range(q.shape[0]):
            idx = kv_indices[kv[i] : kv[i + 1]].long()
            mask = torch.ones(1, idx.numel(), dtype=torch.bool)
            o[i : i + 1] = _attend(
                q[i : i + 1], k_buffer[idx], v_buffer[idx], mask, sm_scale, k_scale, v_scale
            ).to(o.dtype)

    extend_attention.extend_attention_fwd = extend_attention_fwd
    decode_attention.decode_attention_fwd = decode_attention_fwd


def install() -> None:
    for standin in STANDINS:
        standin()
