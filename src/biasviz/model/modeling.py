"""The GPT-2 variant: pre-LN blocks whose attention adds the scheme's bias, with named hook points.

Module paths (and so hook names) follow TransformerLens: ``blocks.{L}.attn.hook_bias`` and
``blocks.{L}.attn.hook_pattern``. Inside a block the layer names are nanoGPT's (``ln_1``,
``attn.c_attn``, ``attn.c_proj``, ``ln_2``, ``mlp.c_fc``, ``mlp.c_proj``) so that nanoGPT-style
state dicts map onto this model by renaming prefixes only.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from biasviz.common.errors import too_long
from biasviz.model import blocked_grad, flex_grad, fused, routes
from biasviz.model.attention import (
    MIN_ROWS,
    SDPA_BLOCK_CAP,
    attention_pattern,
    attention_scores,
    block_budget,
    causal_mask,
    masked_softmax,
    masked_softmax_,
    query_blocks,
    sdpa_mask,
)
from biasviz.model.config import BiasGPTConfig
from biasviz.model.hooks import HookPoint
from biasviz.schemes import PositionScheme
from biasviz.schemes.base import ScoreTerms


class Attention(nn.Module):
    """Causal multi-head self-attention with an additive positional bias.

    With autograd (training) every (query, key) cell is formed at once, as GPT-2 does. Without it
    (extraction, evaluation) attention is formed one block of query rows at a time
    (:func:`biasviz.model.attention.query_blocks`), the bias included, so memory per layer is
    O(B * H * rows * T), never (H, T, T). Either way two routes give the same outputs: a fused one
    (PyTorch SDPA, the bias passed as an additive mask) that never forms the weights, used when
    nobody listens at ``hook_pattern``; and an eager one that forms them and passes them through it.
    """

    # scores per query block; None: the device's default. Set, it also keeps the strided table (blocks of its own) out
    block_elements: int | None = None

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
        # Each passes a block of query rows starting at row0: [batch or 1, head, rows, keys], keys = row0 + rows
        # (the whole matrix, row0 = 0 and rows = keys = T, in training).
        self.hook_bias = HookPoint()  # additive bias, before the causal mask: [batch or 1, head, rows, keys]
        self.hook_pattern = HookPoint()  # post-softmax weights, 0 past the diagonal: [batch, head, rows, keys]
        self.hook_scores = HookPoint()  # the softmax's input, scale·q·k + bias, every cell: [batch, head, rows, keys]
        # q and k as the scores take them (TransformerLens' layout): [batch, position, head, head dim]
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()

    @property
    def adds_bias(self) -> bool:
        return self.pos_bias is not None and self.pos_bias.adds_bias

    def _needs_grad(self, q: torch.Tensor) -> bool:
        """Whether autograd must see this forward (then the full-size differentiable path runs)."""
        if not torch.is_grad_enabled():
            return False
        if q.requires_grad:
            return True
        return self.adds_bias and any(p.requires_grad for p in self.pos_bias.parameters())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, self.head_dim) for t in self.c_attn(x).split(C, dim=2))  # (B, T, H, hd)
        if self.pos_bias is not None and self.pos_bias.rotary:
            q, k = self.pos_bias.rotate(q, k)  # RoPE: the position enters q and k, not the scores
        q, k = self.hook_q(q), self.hook_k(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        if self._needs_grad(q):
            y = self._full(x, q, k, v)  # (B, H, T, hd)
            y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        else:
            y = self._blocked(x, q, k, v).reshape(B, T, C)  # (B, T, C): a view unless SDPA returned (B, H, T, hd)
        return self.c_proj(y)

    def _facts(self, q: torch.Tensor, grad: bool) -> routes.Facts:
        """What this call's route depends on (:mod:`biasviz.model.routes`), the bias's compact form aside."""
        return routes.Facts(
            grad=grad, adds_bias=self.adds_bias, hook_bias=self.hook_bias.active,
            hook_pattern=self.hook_pattern.active, hook_scores=self.hook_scores.active,
            dropout=self.training and self.dropout > 0, mode=fused.mode(), device=q.device.type, seq_len=q.shape[-2],
            min_len=fused.MIN_LEN, one_block=grad and blocked_grad.one_block(q),
            table_allowed=self.block_elements is None,  # blocks of rows asked for: not the table's own blocks
            intercepted=fused.intercepted(), flex_failed=fused.flex_failed(q.device),
            backward_runs=fused.backward_runs(q.device),
        )  # fmt: skip

    def _route(self, x: torch.Tensor, q: torch.Tensor, grad: bool) -> tuple[routes.Route, ScoreTerms | None]:
        """The route of this call, and the bias in the form a kernel reads per cell where the route needed it."""
        facts = self._facts(q, grad)
        terms = self.pos_bias.score_terms(x) if routes.asks_terms(facts) else None
        known = dataclasses.replace(facts, has_terms=terms is not None,
                                    has_table=terms is not None and terms.distance is not None)  # fmt: skip
        return routes.choose(known), terms

    def _full(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Differentiable (training): (B, H, T, hd). A bias with a compact form (:meth:`score_terms`) goes through
        compiled FlexAttention on a GPU (:mod:`~biasviz.model.flex_grad`) and the blocked recomputation elsewhere,
        neither of which keeps a (query, key) cell for the backward pass; otherwise every cell at once, as GPT-2
        does (dropout on the weights, or a hook listening). On a CPU, attention whose cells fit in one of the
        recomputation's blocks takes every cell at once too: it keeps no more, and the tiny models' training steps
        of ``make figures`` take half the time. The route is :func:`routes.choose`'s, counted (:func:`fused.took`)."""
        T = x.shape[1]
        route, terms = self._route(x, q, grad=True)
        if route.name in ("flex", "blocked-grad"):
            out = flex_grad.run(q, k, v, terms, self.scale) if route.name == "flex" else None  # forward and backward
            fused.took(route.name if out is not None else "blocked-grad")
            return out if out is not None else blocked_grad.attend(q, k, v, terms, self.scale)
        fused.took(route.name)  # causal or dense
        bias = self.hook_bias(self.pos_bias(x, T, T), 0) if self.adds_bias else None  # (1 or B, H, T, T)
        masked = causal_mask(T, T, x.device)  # (T, T)
        dropout_p = self.dropout if self.training else 0.0
        if self.hook_scores.active:  # formed where someone listens only
            self.hook_scores(attention_scores(q.detach(), k.detach(), None if bias is None else bias.detach(),
                                              self.scale), 0)  # fmt: skip
        if self.hook_pattern.active:
            pattern = self.hook_pattern(attention_pattern(q, k, bias, masked, self.scale), 0)  # (B, H, T, T)
            if dropout_p > 0:
                pattern = F.dropout(pattern, dropout_p, self.training)
            return pattern.to(v.dtype) @ v
        if bias is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=self.scale)
        mask = bias.to(q.dtype).masked_fill(masked, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.scale)

    @torch.no_grad()
    def _blocked(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One block of query rows at a time, without autograd: (B, T, H, hd)."""
        B, H, T, hd = q.shape
        dropout_p = self.dropout if self.training else 0.0
        eager = self.hook_pattern.active or self.hook_scores.active
        route, terms = self._route(x, q, grad=False)
        if route.name == "causal":  # fused kernels are blocked themselves and mask by position
            fused.took("causal")
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=self.scale)
            return y.transpose(1, 2)  # (B, T, H, hd)
        out = None
        if route.name == "table":
            out = fused.attend_by_table(q, k, v, terms.distance, self.scale)
        elif route.name == "flex":
            out = fused.attend_flex(q, k, v, terms, self.scale)  # None where the kernel does not run here
        if out is not None:
            fused.took(route.name)
            return out.transpose(1, 2)  # (B, T, H, hd)
        fused.took(route.fallback or route.name)  # eager or blocked
        rows_of = self.pos_bias.rows(x) if self.adds_bias else None  # (r0, r1) -> (1 or B, H, rows, r1)
        # contiguous, so that each block's keys k[:, :, :r1] are (B * H) matrices matmul reads without a copy
        q, k, v = (t.contiguous() for t in (q, k, v))  # (B, H, T, hd)
        y = torch.empty(B, T, H, hd, dtype=v.dtype, device=v.device)  # (B, T, H, hd)
        budget = block_budget(x.device, self.block_elements)
        if not eager and self.block_elements is None:  # SDPA calls: at least MIN_ROWS rows, within a memory cap
            budget = max(budget, min(B * H * MIN_ROWS * T, SDPA_BLOCK_CAP))
        for r0, r1 in query_blocks(T, B * H, budget):
            bias = None if rows_of is None else self.hook_bias(rows_of(r0, r1), r0)  # (1 or B, H, rows, r1)
            q_blk, k_blk, v_blk = q[:, :, r0:r1], k[:, :, :r1], v[:, :, :r1]  # (B, H, rows | r1, hd)
            if eager:
                pattern = self.hook_pattern(self._rows(q_blk, k_blk, bias, r0), r0)  # (B, H, rows, r1)
                if dropout_p > 0:
                    pattern = F.dropout(pattern, dropout_p, self.training)
                out = pattern.to(v.dtype) @ v_blk  # (B, H, rows, hd)
            else:
                mask = sdpa_mask(bias, r0, r1, q.dtype, owned=not self.hook_bias.active)  # (1 or B, H, rows, r1)
                out = F.scaled_dot_product_attention(
                    q_blk, k_blk, v_blk, attn_mask=mask, dropout_p=dropout_p, scale=self.scale
                )  # (B, H, rows, hd)
            y[:, r0:r1] = out.transpose(1, 2)
        return y

    def _rows(self, q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None, r0: int) -> torch.Tensor:
        """The weights of a block of rows, its scores passed through ``hook_scores`` first where someone listens."""
        if not self.hook_scores.active:
            return self.pattern_rows(q, k, bias)
        scores = self.hook_scores(attention_scores(q, k, bias, self.scale), r0)  # (B, H, rows, r1)
        rows = q.shape[-2]
        # copied: what a hook returned may be a view it keeps, read-only or overlapping, and must not be written to
        return masked_softmax_(scores.clone(), causal_mask(rows, rows, q.device))

    def pattern_rows(self, q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Weights of a causal block of query rows, the last ``rows`` of ``r1`` positions: q (B, H, rows, hd),
        k (B, H, r1, hd), bias (1 or B, H, rows, r1) or None -> (B, H, rows, r1), in float32.

        The one place the eager weights are formed: the forward and a summary forming a block again agree.
        """
        rows = q.shape[-2]
        square = causal_mask(rows, rows, q.device)  # (rows, rows): keys r0..r1-1, the only masked columns
        return attention_pattern(q, k, bias, square, self.scale)

    @torch.no_grad()
    def rows_again(self, x: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor, r0: int,
                   want_bias: bool = True) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:  # fmt: skip
        """Bias (or None), weights and scores of query rows ``r0 ..`` of one input, formed again from what passed
        this layer: its input ``x`` (B, T, C) (None without a bias), q (B, rows, H, hd) of those rows and k
        (B, r1, H, hd) of keys 0 .. r1 - 1 (``hook_q``/``hook_k``'s layout). The weights and bias are the values
        the forward passes through ``hook_pattern`` and ``hook_bias``; the scores are the softmax's input
        (scale·q·k + bias) before the causal mask. The bias is returned only when ``want_bias``."""
        rows = q.shape[1]
        bias = self.pos_bias.rows(x)(r0, r0 + rows) if self.adds_bias else None  # (1 or B, H, rows, r1)
        # the arithmetic of pattern_rows, with the scores kept: attention_pattern is these two steps
        scores = attention_scores(q.transpose(1, 2), k.transpose(1, 2), bias, self.scale)  # (B, H, rows, r1)
        weights = masked_softmax(scores, causal_mask(rows, rows, q.device))
        return (bias if want_bias else None), weights, scores


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
