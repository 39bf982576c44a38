"""The GPT-2 variant: pre-LN blocks whose attention adds the scheme's bias, with named hook points.

Module paths (and so hook names) follow TransformerLens: ``blocks.{L}.attn.hook_bias`` and
``blocks.{L}.attn.hook_pattern``. Inside a block the layer names are nanoGPT's (``ln_1``,
``attn.c_attn``, ``attn.c_proj``, ``ln_2``, ``mlp.c_fc``, ``mlp.c_proj``) so that nanoGPT-style
state dicts map onto this model by renaming prefixes only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from biasviz.common.errors import too_long
from biasviz.model.config import BiasGPTConfig
from biasviz.model.hooks import HookPoint
from biasviz.schemes import PositionScheme


def causal_mask(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """True where key j lies after query i (cells the causal mask removes), (Tq, Tk)."""
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    return torch.arange(k_len, device=device)[None, :] > i


def attention_pattern(
    q: torch.Tensor,
    k: torch.Tensor,
    bias: torch.Tensor | None,
    masked: torch.Tensor | None,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(scale * q k^T + bias) over keys, in float32: (B, H, Tq, Tk).

    ``scale`` None is 1/sqrt(d_head). ``masked`` (Tq, Tk) is True where a key must be ignored (the
    causal mask); None attends everywhere. When no gradient is wanted (extraction, evaluation) the
    weights come from :func:`attention_pattern_blocked`, the same numbers with bounded temporaries;
    otherwise from the differentiable full-size formula.
    """
    tracked = (q, k) if bias is None else (q, k, bias)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tracked)):
        return attention_pattern_blocked(q, k, bias, masked, scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q.float() @ k.float().transpose(-2, -1)) * scale  # (B, H, Tq, Tk)
    if bias is not None:
        scores = scores + bias.float()
    if masked is not None:
        scores = scores.masked_fill(masked, float("-inf"))
    return torch.softmax(scores, dim=-1)


BLOCK_ELEMENTS = 1 << 20  # CPU: scores per (sample, head, query block), 4 MiB of float32, stays in cache
CUDA_BLOCK_ELEMENTS = 1 << 26  # CUDA: scores per query block over every sample and head, 256 MiB of float32


def query_blocks(masked: torch.Tensor | None, q_len: int, k_len: int, rows: int) -> list[tuple[int, int, int]]:
    """``(first row, end row, end key)`` per block of query rows; keys at or past ``end key`` are all masked.

    A causal mask leaves every key after the block's last query out, so those columns need neither
    scores nor a softmax (about half the work at long lengths). The mask is read once (one device
    synchronisation on a GPU, not one per block).

    >>> query_blocks(causal_mask(4, 4, torch.device("cpu")), 4, 4, rows=2)
    [(0, 2, 2), (2, 4, 4)]
    """
    if masked is None:
        return [(r0, min(r0 + rows, q_len), k_len) for r0 in range(0, q_len, rows)]
    keys = torch.arange(1, k_len + 1, device=masked.device)
    row_end = torch.where(masked, 0, keys).amax(dim=1).tolist()  # per query: one past its last visible key
    blocks = []
    for r0 in range(0, q_len, rows):
        r1 = min(r0 + rows, q_len)
        k_end = max(row_end[r0:r1])
        blocks.append((r0, r1, k_end if k_end > 0 else k_len))
    return blocks


@torch.no_grad()
def attention_pattern_blocked(
    q: torch.Tensor,
    k: torch.Tensor,
    bias: torch.Tensor | None,
    masked: torch.Tensor | None,
    scale: float | None = None,
    block_elements: int | None = None,
    batched: bool | None = None,
) -> torch.Tensor:
    """:func:`attention_pattern` without autograd, one block of query rows at a time.

    Each block's scores are formed in a scratch buffer, biased and masked in place and their softmax
    copied into the returned (B, H, Tq, Tk) float32 tensor, so the only memory beyond the result is
    two blocks of ``block_elements`` scores: the full-size scores, biased scores and softmax output
    of the reference never coexist (at T = 8192 each of those is 3 GiB per sample). Keys that all of
    a block's queries mask are set to 0 without being computed.

    On the CPU a block is one (sample, head, rows) slice that stays in cache; on a GPU a block spans
    every sample and head, so a few large batched kernels replace a Python loop over heads
    (``batched`` None: batched off the CPU).
    """
    B, H, Tq, _ = q.shape
    Tk = k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    qf, kf = q.float(), k.float()
    out = torch.empty(B, H, Tq, Tk, dtype=torch.float32, device=q.device)  # (B, H, Tq, Tk)
    batched = q.device.type != "cpu" if batched is None else batched
    if block_elements is None:
        block_elements = CUDA_BLOCK_ELEMENTS if batched else BLOCK_ELEMENTS
    per_row = Tk * (B * H if batched else 1)
    rows = max(1, min(Tq, block_elements // max(per_row, 1)))
    blocks = query_blocks(masked, Tq, Tk, rows)
    lead = (B, H) if batched else ()
    scratch = torch.empty(math.prod(lead) * rows * Tk, dtype=torch.float32, device=q.device)
    slices = [(slice(None), slice(None))] if batched else [(b, h) for b in range(B) for h in range(H)]
    for b, h in slices:
        bb = b if bias is None or bias.shape[0] != 1 else slice(0, 1) if batched else 0  # (1, ...) serves all
        kt = kf[b, h].transpose(-2, -1)  # (..., hd, Tk)
        for r0, r1, k_end in blocks:
            s = scratch[: math.prod(lead) * (r1 - r0) * k_end].view(*lead, r1 - r0, k_end)  # (..., rows, k_end)
            torch.matmul(qf[b, h, r0:r1], kt[..., :k_end], out=s)
            s.mul_(scale)
            if bias is not None:
                s.add_(bias[bb, h, r0:r1, :k_end])
            if masked is not None:
                s.masked_fill_(masked[r0:r1, :k_end], float("-inf"))
            out[b, h, r0:r1, :k_end] = torch.softmax(s, dim=-1)
            if k_end < Tk:
                out[b, h, r0:r1, k_end:] = 0.0
    return out


def attend_blocked(pattern: torch.Tensor, v: torch.Tensor, masked: torch.Tensor | None) -> torch.Tensor:
    """``pattern @ v`` skipping the keys a causal query block never sees (their weights are 0): (B, H, Tq, hd)."""
    B, H, Tq, Tk = pattern.shape
    y = torch.empty(B, H, Tq, v.shape[-1], dtype=v.dtype, device=v.device)
    rows = max(1, min(Tq, BLOCK_ELEMENTS // max(Tk, 1)))
    for r0, r1, k_end in query_blocks(masked, Tq, Tk, rows):
        y[:, :, r0:r1] = pattern[:, :, r0:r1, :k_end].to(v.dtype) @ v[:, :, :k_end]
    return y


class Attention(nn.Module):
    """Causal multi-head self-attention with an additive positional bias.

    Two paths give the same outputs: a fused one (PyTorch SDPA, the bias passed as an additive
    mask) that never forms the (T, T) weights, used when nobody listens at ``hook_pattern``; and an
    eager one that forms them and passes them through ``hook_pattern``.
    """

    def __init__(self, config: BiasGPTConfig, scheme: PositionScheme | None, owns_scheme: bool = True) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        scale = getattr(config, "attn_scale", None)
        self.scale = 1.0 / math.sqrt(self.head_dim) if scale is None else float(scale)  # multiplies q.k
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.linear_bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.linear_bias)
        self.dropout = config.dropout
        if owns_scheme:
            self.pos_bias = scheme
        else:  # shared with another layer: keep a reference without registering it twice
            object.__setattr__(self, "pos_bias", scheme)
        self.hook_bias = HookPoint()  # [batch or 1, head, query, key]
        self.hook_pattern = HookPoint()  # [batch, head, query, key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)

        bias = None
        if self.pos_bias is not None and self.pos_bias.adds_bias:
            bias = self.hook_bias(self.pos_bias(x, T, T))  # (1 or B, H, T, T)

        masked = causal_mask(T, T, x.device)  # (T, T)
        dropout_p = self.dropout if self.training else 0.0
        if self.hook_pattern.active:
            formed = attention_pattern(q, k, bias, masked, self.scale)  # (B, H, T, T)
            pattern = self.hook_pattern(formed)
            if dropout_p > 0:
                pattern = F.dropout(pattern, dropout_p, self.training)
            if pattern is formed and not formed.requires_grad:
                y = attend_blocked(pattern, v, masked)  # skips the keys whose weights are exactly 0
            else:  # a hook's replacement, dropout or autograd: no assumption about the zeros
                y = pattern.to(v.dtype) @ v
        elif bias is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=self.scale)
        else:
            mask = bias.to(q.dtype).masked_fill(masked, float("-inf"))
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.scale)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: BiasGPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.linear_bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.linear_bias)
        # GPT-2 uses the tanh approximation of GELU; nanoGPT's nn.GELU() is the exact (erf) one
        self.approximate = "none" if getattr(config, "activation", "gelu_tanh") == "gelu" else "tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate))


class Block(nn.Module):
    def __init__(self, config: BiasGPTConfig, scheme: PositionScheme | None, owns_scheme: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.linear_bias)
        self.attn = Attention(config, scheme, owns_scheme)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.linear_bias)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_1(x)))
        return x + self.drop(self.mlp(self.ln_2(x)))


class BiasGPTForCausalLM(PreTrainedModel):
    """A causal language model; ``forward(input_ids)`` returns logits (and the loss with labels)."""

    config_class = BiasGPTConfig
    base_model_prefix = "biasgpt"
    _tied_weights_keys = {"lm_head.weight": "embed.weight"}
    _no_split_modules = ["Block"]

    def __init__(self, config: BiasGPTConfig) -> None:
        super().__init__(config)
        scheme_cls = config.scheme_class
        self.embed = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_embed = nn.Embedding(config.n_positions, config.n_embd) if scheme_cls.absolute_positions else None
        self.drop = nn.Dropout(config.dropout)
        blocks = []
        shared = None
        for _ in range(config.n_layer):
            if config.share_position_params and shared is not None:
                blocks.append(Block(config, shared, owns_scheme=False))
                continue
            scheme = scheme_cls(config.n_head, config.n_embd, **config.scheme_options)
            shared = scheme
            blocks.append(Block(config, scheme, owns_scheme=True))
        self.blocks = nn.ModuleList(blocks)
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.linear_bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()

    def _initialize_weights(self, module: nn.Module, is_custom_code: bool = False) -> None:
        """Initialise the modules whose weights sit in their children (schemes, Attention, MLP) too.

        transformers skips a module of custom code when all of its *own* tensors are initialised, which
        is vacuously true for a module without direct parameters: the T5 table and the residual scaling
        would keep the default init. Here such a module is skipped only when every tensor below it was
        loaded or initialised already.
        """
        if isinstance(module, (PositionScheme, Attention, MLP)) and not getattr(module, "_is_hf_initialized", False):
            tensors = [*module.parameters(), *module.buffers()]
            if not (tensors and all(getattr(t, "_is_hf_initialized", False) for t in tensors)):
                self._init_weights(module)
            module._is_hf_initialized = True
            return
        super()._initialize_weights(module, is_custom_code)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, PositionScheme):
            module.reset_parameters()  # runs after its children (nn.Module.apply is post-order)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (Attention, MLP)):
            # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer)
            nn.init.normal_(module.c_proj.weight, std=std / math.sqrt(2 * self.config.n_layer))

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    @property
    def max_length(self) -> int | None:
        """The longest input the model accepts (None: any length, for relative schemes)."""
        return self.config.n_positions if self.pos_embed is not None else None

    def check_length(self, seq_len: int) -> None:
        """Raise a clear error for lengths a `learned` model has no positions for."""
        if self.max_length is not None and seq_len > self.max_length:
            raise too_long(self.config.scheme, self.max_length, seq_len)

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        **kwargs: object,
    ) -> CausalLMOutput:
        B, T = input_ids.shape
        self.check_length(T)
        x = self.embed(input_ids)  # (B, T, C)
        if self.pos_embed is not None:
            x = x + self.pos_embed(torch.arange(T, device=input_ids.device))
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))
        return CausalLMOutput(loss=loss, logits=logits)

    def schemes(self) -> list[PositionScheme]:
        """The distinct scheme modules (one per layer, or one when shared)."""
        seen: list[PositionScheme] = []
        for block in self.blocks:
            s = block.attn.pos_bias
            if s is not None and all(s is not t for t in seen):
                seen.append(s)
        return seen
