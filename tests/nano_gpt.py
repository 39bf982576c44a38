"""A GPT written the way nanoGPT's model.py is, for tracing tests: its two attention paths.

With ``flash=True`` attention is one ``scaled_dot_product_attention(q, k, v, attn_mask=None,
dropout_p=..., is_causal=True)`` call (nanoGPT's default since PyTorch 2.0); with ``flash=False`` it
is formed by hand (``(q @ k^T) / sqrt(d)``, the ``bias`` buffer's causal mask, softmax) and kept in
``last_att``: the reference the traced fused call is compared with. Written here; nanoGPT itself is
not a package on PyPI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 101
    n_layer: int = 3
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, flash: bool) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.n_embd, self.dropout, self.flash = config.n_head, config.n_embd, config.dropout, flash
        if not flash:
            mask = torch.tril(torch.ones(config.block_size, config.block_size))
            self.register_buffer("bias", mask.view(1, 1, config.block_size, config.block_size), persistent=False)
        self.last_att: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for z in (q, k, v))
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                               dropout_p=self.dropout if self.training else 0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            self.last_att = att
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, flash: bool) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(config.n_embd), nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config, flash)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(),
                                 nn.Linear(4 * config.n_embd, config.n_embd))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, flash: bool = True) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(config.vocab_size, config.n_embd),
            "wpe": nn.Embedding(config.block_size, config.n_embd),
            "h": nn.ModuleList(Block(config, flash) for _ in range(config.n_layer)),
            "ln_f": nn.LayerNorm(config.n_embd),
        })  # fmt: skip
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def pair(seed: int = 0) -> tuple[GPT, GPT]:
    """The same weights twice: the fused (SDPA) model and the explicit one."""
    torch.manual_seed(seed)
    fused = GPT(GPTConfig(), flash=True).eval()
    explicit = GPT(GPTConfig(), flash=False).eval()
    explicit.load_state_dict(fused.state_dict())
    return fused, explicit


def make(checkpoint: str | None = None) -> GPT:
    """A factory for ``biasviz extract --model tests/nano_gpt.py:make [--checkpoint STATE_DICT]``."""
    fused, _ = pair()
    if checkpoint is not None:
        fused.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
    return fused
