"""The multi-token-prediction (MTP) head of the Qwen3.5 family (model-math.md §3.1).

For the target's final-normed hidden `h_t` and the next token `x_{t+1}`:
`u = fc([N_e(emb(x_{t+1})) ; N_h(h_t)])` (embedding first), `u = layer(u)` at position `t`,
`ĥ = N_mtp(u)`, and `lm_head(ĥ)` predicts `x_{t+2}`. The layer is one gated-attention decoder
layer with the target's FFN type and its own KV (an `MtpKv` per sequence); the embedding and
the head are the target's. All four norms are zero-centred `(1+w)`.

`load_mtp` builds it from an artifact's `mtp` component (names as `ninfer convert hf` and
`ninfer synth --mtp` write them: `mtp/{input_projection, embedding_norm, hidden_norm,
final_norm}` and `mtp/layers/0/...` with the text-layer names).
"""
from __future__ import annotations

import torch

from .fused import FusedParams
from .gated_attention import PartialRope, zero_centred_rms_norm
from .layers import Linear
from .qwen3_5 import ParamSource, Qwen35Model, _Block

MTP_ARCHITECTURES = ("Qwen3_5MTP", "Qwen3_5MoeMTP")


class MtpMissing(ValueError):
    """The artifact has no usable `mtp` component."""


class MtpKv:
    """One sequence's MTP-layer keys and values, `KVCache`'s contract over a buffer that
    doubles when full: an append copies only the new entries (a `torch.cat` per step would
    copy the whole history), a cut back to the committed pairs only moves the length."""

    def __init__(self, nkv: int, d: int, dtype: torch.dtype, device: torch.device,
                 capacity: int = 64) -> None:
        self.k = torch.empty(nkv, capacity, d, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.length = 0

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v [nkv, T, D]; returns all keys and values so far."""
        end = self.length + k.shape[1]
        if end > self.k.shape[1]:
            spare = max(end, 2 * self.k.shape[1]) - self.length
            self.k, self.v = (torch.cat([t[:, : self.length],
                                         t.new_empty(t.shape[0], spare, t.shape[2])], 1)
                              for t in (self.k, self.v))
        self.k[:, self.length: end], self.v[:, self.length: end] = k, v
        self.length = end
        return self.k[:, :end], self.v[:, :end]

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions."""
        self.length = length


class MtpHead:
    """The MTP layer of `target` (a `Qwen35Model`), its weights read from `params`."""

    def __init__(self, target: Qwen35Model, params: ParamSource,
                 matmul_dtype: torch.dtype | None = None) -> None:
        config = target.config
        # each GEMV group one matrix, the routed experts views of [E, 2I, H] / [E, H, I]
        # stacks (on CUDA two grouped GEMMs a draft step, where separate experts looped with a
        # host sync, `SparseMoE`): the layout the captured draft round reads (`mtp_step`)
        self.params = params = FusedParams(config, params)
        h = config["hidden_size"]
        self.target, self.eps = target, config["rms_norm_eps"]
        self.embedding_norm = params("mtp/embedding_norm", (h,))
        self.hidden_norm = params("mtp/hidden_norm", (h,))
        self.final_norm = params("mtp/final_norm", (h,))
        self.fc = Linear(params("mtp/input_projection", (h, 2 * h)), matmul_dtype,
                         relayout=False)
        # one full-attention layer of the target's geometry; its FFN is never a dense-only one
        layer = {**config, "layer_types": ["full_attention"], "mlp_only_layers": []}
        rope = PartialRope(config["head_dim"], config["rope_parameters"], target.device)
        # under tensor parallelism `config` and `params` are the rank's share: the layer
        # all-reduces its outputs as the target's layers do
        self.block = _Block(layer, params, 0, rope, matmul_dtype, prefix="mtp/layers/0/",
                            reduce=target.ranks.all_reduce)

    def new_cache(self) -> MtpKv:
        """An empty contiguous MTP-layer KV for one sequence: a one-off run of the head (the
        tests' reference); the engine keeps the layer's K/V in its KV pool (`mtp_drafter`)."""
        mixer = self.block.mixer
        return MtpKv(mixer.nkv, mixer.d, self.target.dtype, self.target.device)

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, hidden: torch.Tensor, caches: list[MtpKv],
                 lengths: list[int], positions: torch.Tensor,
                 media: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """ĥ [T, H] for T pairs (token `tokens[i]` = x_{t+1}, target hidden `hidden[i]` = h_t,
        at rotary `positions` of t: [T], or [3, T] MRoPE), rows of `lengths` pairs each
        continuing its `caches` entry; `media`: (pair rows, encoder rows) whose x_{t+1} is a
        media placeholder, embedded by its vision row as the target's input is (§3.1)."""
        x = self.target.embed(tokens)
        if media is not None:
            x = x.index_copy(0, media[0], media[1].to(x.dtype))
        e = zero_centred_rms_norm(x, self.embedding_norm, self.eps)
        h = zero_centred_rms_norm(hidden, self.hidden_norm, self.eps)
        u = self.fc(torch.cat([e, h], -1))
        u = self.block(u, caches, lengths, positions)
        return zero_centred_rms_norm(u, self.final_norm, self.eps)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The target's head over MTP outputs: [T, H] -> [T, V]."""
        return self.target.logits(h)


def load_mtp(artifact, target, device: torch.device, dtype: torch.dtype,
             matmul_dtype: torch.dtype | None = None) -> MtpHead:
    """The MTP head of `artifact`'s `mtp` component on `device`, decoded to `dtype` like the
    CPU path's text weights; `MtpMissing` naming what is absent otherwise."""
    where = getattr(artifact, "path", None) or getattr(artifact, "name", None) or "the artifact"
    if not isinstance(target, Qwen35Model):
        raise MtpMissing("--spec mtp needs a Qwen3.5-family model (it drafts from the MTP head "
                         "those checkpoints ship)")
    components = getattr(artifact, "components", None) or {}
    if "mtp" not in components:
        raise MtpMissing(f"--spec mtp needs an mtp component (the MTP head's weights); {where} "
                         "has none: convert a checkpoint that ships mtp.* tensors, or add a "
                         "random one with `ninfer synth --mtp`")
    arch = (components["mtp"].get("config", {}).get("architectures") or ["?"])[0]
    if arch not in MTP_ARCHITECTURES:
        raise MtpMissing(f'the mtp component of {where} is "{arch}", not one of '
                         f"{', '.join(MTP_ARCHITECTURES)}")

    def params(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if not artifact.has_parameter(name):
            raise MtpMissing(f'the mtp component of {where} lacks "{name}"')
        return artifact.parameter(name, shape).to(device, dtype)

    return MtpHead(target, params, matmul_dtype)
