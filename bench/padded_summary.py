"""A summary of samples masked differently (left padding) in a model whose rows biasviz forms again: time and peak
RSS of the summary formed again from the bank against the same call streamed whole (how it ran before), each in a
fresh process, interleaved (BENCHMARKS.md §14). A one-layer transformers Llama (hidden 256, 4 heads), random
weights, N = 3 windows of T tokens in one batch, the second padded on the left by T / 8 tokens, the third by T / 3,
given to the model as an ``attention_mask``; ``--unpadded`` adds the same summary without padding, formed again and
streamed, and ``--full`` a full file of the padded samples (every cell as the model formed it). ``--window W``: a
Mistral of the same size with a sliding window of W keys instead (one mask for every sample, then, beside the padding).
``--head-windows``: one SDPA layer of the same size whose heads each see a window of their own (T / 16, T / 8, T / 4,
every key) over the padding: cells that differ by head and by sample. ``--encoder``: a ModernBERT of the same size, two
layers (the first sees every key, the second a window of T / 8 on both sides), whose rows see keys after the query.
``--alibi``: one SDPA layer of the same size that adds ALiBi in its float mask, as research code writes it (padded keys
-inf there too). ``--bloom``: a one-layer transformers BLOOM of the same size, whose ALiBi positions start after each
sample's padding (its bias differs by sample). ``--depth D``: the Llama or Mistral has D layers, every one summarised
(the masks every layer keeps).
``--trees BEFORE AFTER``: each run by two versions of biasviz in turn (their ``src`` first on ``PYTHONPATH``), to
measure a change; ``--resolution R``: maps of R x R blocks (default: exact per cell, whose standard errors need no
per-sample block means).

    .venv/bin/python bench/padded_summary.py --seq-len 2048 --repeats 2
    .venv/bin/python bench/padded_summary.py --seq-len 2048 --resolution 256 --unpadded --window 256 \
        --trees /path/to/old/checkout .
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import timed_into_temporary  # noqa: E402

SAMPLES = 3


def head_windows(seq_len: int) -> object:
    """One SDPA layer (hidden 256, 4 heads) whose heads see windows of their own, each sample's padding left out."""
    import torch

    class HeadWindows(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(512, 256)
            self.qkv = torch.nn.Linear(256, 3 * 256)
            self.windows = torch.tensor([seq_len // 16, seq_len // 8, seq_len // 4, seq_len])[:, None, None]

        def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            b, t = ids.shape
            q, k, v = (z.view(b, t, 4, 64).transpose(1, 2) for z in self.qkv(self.embed(ids)).split(256, -1))
            i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
            keep = ((j <= i) & (i - j < self.windows))[None] & attention_mask.bool()[:, None, None, :]
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    return HeadWindows().eval()


def alibi_layer() -> object:
    """One SDPA layer (hidden 256, 4 heads) adding -slope·(i - j) in its float mask, padded keys and j > i -inf."""
    import torch

    class AlibiLayer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(512, 256)
            self.qkv = torch.nn.Linear(256, 3 * 256)
            self.slopes = torch.tensor([2.0 ** (-2 * (h + 1)) for h in range(4)])[:, None, None]

        def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            b, t = ids.shape
            q, k, v = (z.view(b, t, 4, 64).transpose(1, 2) for z in self.qkv(self.embed(ids)).split(256, -1))
            i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
            kept = (j <= i)[None, None] & attention_mask.bool()[:, None, None, :]
            bias = (-self.slopes * (i - j))[None].masked_fill(~kept, float("-inf"))
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    return AlibiLayer().eval()


def child(how: str, seq_len: int, resolution: int | None = None, window: int | None = None,
          heads_differ: bool = False, encoder: bool = False, alibi: bool = False,
          bloom: bool = False, depth: int = 1) -> dict[str, float]:  # fmt: skip
    import warnings

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    import biasviz
    import biasviz.extraction.summary as summary

    torch.manual_seed(0)
    size = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": depth,
            "intermediate_size": 512, "vocab_size": 512, "max_position_embeddings": seq_len,
            "attn_implementation": "sdpa"}  # fmt: skip
    if heads_differ:
        model = head_windows(seq_len)
    elif alibi:
        model = alibi_layer()
    elif bloom:
        from transformers import BloomConfig, BloomForCausalLM

        model = BloomForCausalLM(BloomConfig(vocab_size=512, hidden_size=256, n_layer=1, n_head=4)).eval()
    elif encoder:
        from transformers import ModernBertConfig, ModernBertModel

        tokens = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2}
        model = ModernBertModel(ModernBertConfig(**{**size, "num_hidden_layers": 2}, local_attention=seq_len // 4,
                                                 **tokens)).eval()  # fmt: skip
    elif window is None:
        model = LlamaForCausalLM(LlamaConfig(**size)).eval()
    else:
        model = MistralForCausalLM(MistralConfig(**size, sliding_window=window)).eval()
    ids = torch.randint(1, 512, (SAMPLES, seq_len), generator=torch.Generator().manual_seed(1))
    pad = torch.ones(SAMPLES, seq_len, dtype=torch.long)
    if not how.startswith("unpadded"):
        pad[1, : seq_len // 8] = 0
        pad[2, : seq_len // 3] = 0
    rows = {tuple(r.tolist()): k for k, r in enumerate(ids)}

    def forward(batch: torch.Tensor) -> object:
        return model(batch, attention_mask=pad[[rows[tuple(r.tolist())] for r in batch]])

    if how in ("streamed", "unpadded streamed"):  # the route such a call took before: streamed whole, as formed
        inner = summary._summarise
        summary._summarise = lambda *a, **k: inner(*a, **{**k, "streamed": True})  # type: ignore[assignment]
    warnings.simplefilter("ignore")
    whole = how == "full file"  # every cell of the padded call, as the model formed it
    return timed_into_temporary(lambda out: biasviz.extract(
        model, ids, out, summary=not whole, progress=False, batch_size=SAMPLES, forward=forward,
        layers="all" if encoder or depth > 1 else -1, **({} if whole else {"resolution": resolution})))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--unpadded", action="store_true")
    parser.add_argument("--resolution", type=int, default=None)
    parser.add_argument("--window", type=int, default=None)
    parser.add_argument("--full", action="store_true", help="add a full file of the padded samples")
    parser.add_argument("--head-windows", action="store_true", help="heads with windows of their own")
    parser.add_argument("--encoder", action="store_true", help="a ModernBERT, whose rows see keys after the query")
    parser.add_argument("--alibi", action="store_true", help="ALiBi in an SDPA float mask")
    parser.add_argument("--bloom", action="store_true", help="BLOOM, whose bias starts after each sample's padding")
    parser.add_argument("--depth", type=int, default=1, help="layers of the Llama or Mistral, every one summarised")
    parser.add_argument("--only", nargs="+", default=None, help="run these routes alone (e.g. 'unpadded')")
    parser.add_argument("--trees", type=Path, nargs=2, default=None, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        got = child(args.child, args.seq_len, args.resolution, args.window, args.head_windows, args.encoder,
                    args.alibi, args.bloom, args.depth)  # fmt: skip
        print(json.dumps(got))
        return
    kinds = ["formed again", "streamed", *(["unpadded", "unpadded streamed"] if args.unpadded else []),
             *(["full file"] if args.full else [])]
    kinds = [kind for kind in kinds if args.only is None or kind in args.only]
    trees = {"": None} if args.trees is None else {"before": args.trees[0], "after": args.trees[1]}
    model = ("SDPA layer, a window a head" if args.head_windows else "ModernBERT, 2 layers" if args.encoder
             else "SDPA layer, ALiBi in its mask" if args.alibi else "BLOOM, 1 layer" if args.bloom
             else "Llama" if args.window is None
             else f"Mistral, window {args.window}") + (f", {args.depth} layers" if args.depth > 1 else "")  # fmt: skip
    print(f"{model}, T = {args.seq_len}, R = {args.resolution or 'T'}, N = {SAMPLES} in one batch, "
          f"{args.repeats} interleaved repeats")  # fmt: skip
    options = ["--seq-len", str(args.seq_len)]
    for name in ("resolution", "window", "depth"):
        if getattr(args, name) is not None:
            options += [f"--{name}", str(getattr(args, name))]
    options += ["--head-windows"] if args.head_windows else []
    options += ["--encoder"] if args.encoder else []
    options += ["--alibi"] if args.alibi else []
    options += ["--bloom"] if args.bloom else []
    for r in range(args.repeats):
        for kind in kinds:
            for label, tree in trees.items():
                how = kind.replace("formed again", "replayed")
                env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree.resolve() / "src")}
                done = subprocess.run([sys.executable, __file__, "--child", how, *options], capture_output=True,
                                      text=True, check=True, env=env)  # fmt: skip
                got = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"repeat {r + 1}: {kind:>17} {label:>6}: {got['s']:.2f} s, peak RSS {got['peak_gib']:.2f} GiB",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
