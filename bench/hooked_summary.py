"""A summary of a transformers model that biasviz opens with hooks on its attention modules (BLOOM: ALiBi; T5's
encoder: bucketed relative bias, every key; GPT-2: no bias, eager), of Gemma 2 (traced eager attention, softcapped,
a sliding window of T / 4 in its first layer), of GPT-OSS (traced eager attention over a learned sink column beside the
keys, a sliding window of T / 4 in its first layer, 2 experts), or of a module it traces: attention written in
eager PyTorch (q.kᵀ, + ALiBi, softmax), ``flex_attention`` with ALiBi as a score_mod and a causal block mask, or
``nn.MultiheadAttention`` with ALiBi in its float mask. Time and peak RSS of ``biasviz.extract(path or module,
summary=True)`` on one version of biasviz against another, each run in a fresh process, interleaved (BENCHMARKS.md §14).

Each model has random weights, hidden 256, 4 heads, 2 layers (the traced modules 1 layer), and is saved once to a
temporary directory that every run opens by path, as ``biasviz extract --model`` does (a traced module: its state
dict). N = 3 windows of T tokens in one batch;
every layer summarised; ``--resolution R`` maps of R x R blocks (default: exact per cell).

    .venv/bin/python bench/hooked_summary.py --seq-len 2048 --repeats 2 --trees /path/to/old/checkout .
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import timed_into_temporary  # noqa: E402

SAMPLES = 3
MODELS = ("bloom", "t5", "gpt2", "gemma2", "gpt_oss", "eager", "flex", "mha")


def save(kind: str, seq_len: int, where: Path) -> Path:
    """The model of ``kind``, random weights, saved under ``where`` (the eager module: its state dict)."""
    import torch

    torch.manual_seed(0)
    path = where / kind
    if kind == "bloom":
        from transformers import BloomConfig, BloomForCausalLM

        BloomForCausalLM(BloomConfig(vocab_size=512, hidden_size=256, n_layer=2, n_head=4)).save_pretrained(path)
    elif kind == "t5":
        from transformers import T5Config, T5ForConditionalGeneration

        config = T5Config(vocab_size=512, d_model=256, d_kv=64, d_ff=512, num_layers=2, num_heads=4,
                          dropout_rate=0.0)  # fmt: skip
        T5ForConditionalGeneration(config).save_pretrained(path)
    elif kind == "gemma2":  # softcapped eager attention, traced (transformers loads it eager for the cap)
        from transformers import Gemma2Config, Gemma2ForCausalLM

        config = Gemma2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=4, head_dim=64, attn_logit_softcapping=50.0,
                              sliding_window=seq_len // 4, max_position_embeddings=seq_len)  # fmt: skip
        Gemma2ForCausalLM(config).save_pretrained(path)
    elif kind == "gpt_oss":  # eager attention with sink columns, traced
        from transformers import GptOssConfig, GptOssForCausalLM

        config = GptOssConfig(vocab_size=512, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=4, head_dim=64, num_local_experts=2,
                              num_experts_per_tok=1, sliding_window=seq_len // 4, max_position_embeddings=seq_len,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})  # fmt: skip
        GptOssForCausalLM(config).save_pretrained(path)
    elif kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=512, n_embd=256, n_layer=2, n_head=4, n_positions=seq_len)
        GPT2LMHeadModel(config).save_pretrained(path)
    else:
        torch.save(traced(kind).state_dict(), path)
    return path


def traced(kind: str) -> object:
    """One attention layer (hidden 256, 4 heads) adding -m_h·(i - j), -inf after the query: written out in eager
    PyTorch (``eager``), as flex_attention's score_mod and block mask (``flex``), or as nn.MultiheadAttention's float
    mask (``mha``)."""
    import torch

    class AlibiLayer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(512, 256)
            self.qkv = torch.nn.Linear(256, 3 * 256)
            self.mha = torch.nn.MultiheadAttention(256, 4, batch_first=True)
            self.register_buffer("slopes", torch.tensor([2.0 ** (-2 * (h + 1)) for h in range(4)]))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            b, t = ids.shape
            i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
            bias = (-self.slopes[:, None, None] * (i - j)).masked_fill(j > i, float("-inf"))  # (H, T, T)
            if kind == "mha":
                x = self.embed(ids)
                return self.mha(x, x, x, attn_mask=bias.repeat(b, 1, 1), need_weights=False)[0]
            q, k, v = (z.view(b, t, 4, 64).transpose(1, 2) for z in self.qkv(self.embed(ids)).split(256, -1))
            if kind == "eager":
                return torch.softmax(q @ k.transpose(-1, -2) / 8.0 + bias, dim=-1) @ v
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            slopes = self.slopes
            mask = create_block_mask(lambda n, h, qi, ki: ki <= qi, None, None, t, t, device="cpu")
            return flex_attention(q, k, v, score_mod=lambda s, n, h, qi, ki: s - slopes[h] * (qi - ki), block_mask=mask)

    return AlibiLayer().eval()


def child(kind: str, path: Path, seq_len: int, resolution: int | None) -> dict[str, float]:
    import warnings

    import torch

    import biasviz

    warnings.simplefilter("ignore")
    model: object = path
    if kind in ("eager", "flex", "mha"):
        model = traced(kind)
        model.load_state_dict(torch.load(path, weights_only=True))  # type: ignore[attr-defined]
    ids = torch.randint(1, 512, (SAMPLES, seq_len), generator=torch.Generator().manual_seed(1))
    return timed_into_temporary(lambda out: biasviz.extract(model, ids, out, summary=True, progress=False,
                                                            batch_size=SAMPLES, layers="all", resolution=resolution))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--resolution", type=int, default=None)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--trees", type=Path, nargs=2, default=None, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]), args.seq_len, args.resolution)))
        return
    trees = {"": None} if args.trees is None else {"before": args.trees[0], "after": args.trees[1]}
    print(f"T = {args.seq_len}, R = {args.resolution or 'T'}, N = {SAMPLES} in one batch, every layer, "
          f"{args.repeats} interleaved repeats, {os.cpu_count()} CPUs")  # fmt: skip
    options = ["--seq-len", str(args.seq_len)]
    if args.resolution is not None:
        options += ["--resolution", str(args.resolution)]
    with tempfile.TemporaryDirectory() as tmp:
        paths = {kind: save(kind, args.seq_len, Path(tmp)) for kind in args.models}
        for r in range(args.repeats):
            for kind in args.models:
                for label, tree in trees.items():
                    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree.resolve() / "src")}
                    done = subprocess.run([sys.executable, __file__, "--child", kind, str(paths[kind]), *options],
                                          capture_output=True, text=True, check=True, env=env)  # fmt: skip
                    got = json.loads(done.stdout.strip().splitlines()[-1])
                    print(f"repeat {r + 1}: {kind:>6} {label:>6}: {got['s']:.2f} s, peak RSS {got['peak_gib']:.2f} GiB",
                          flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
