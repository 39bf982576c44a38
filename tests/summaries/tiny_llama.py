"""A tiny Llama (grouped keys, rotary) saved as a transformers directory, for the traced-model summary tests."""

from __future__ import annotations

from pathlib import Path

import torch


def save_tiny_llama(directory: Path, max_len: int, *, heads: int = 4, kv_heads: int = 2, seed: int = 0) -> Path:
    """Two layers of width 64, ``heads`` query heads sharing ``kv_heads`` key heads, RoPE base 500: its directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_len,
                         rope_theta=500.0)  # fmt: skip
    torch.manual_seed(seed)
    path = directory / "llama"
    LlamaForCausalLM(config).save_pretrained(path)
    return path
