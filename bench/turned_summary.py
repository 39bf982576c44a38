"""A summary that learns part-way what its first samples did not show: time and peak RSS of ``extract --summary`` as it
takes such a model, each run in a fresh process, interleaved (BENCHMARKS.md §14).

The model: D layers over an embedding (hidden 256, 4 heads), each one SDPA call adding ALiBi in its float mask and a
small MLP; the last call adds, beside ALiBi, a term of each key's token wherever the text holds token 1. Its summary
(the last call, exact maps, one sample a batch):

- ``--turn bias``: only the last of N samples holds token 1. The summary keeps what forms the rows until that sample
  shows the bias differs, then streams. Before, every sample then ran through the model again from the first; now the
  samples before are formed again from what they kept, and only the last runs again.
- ``--turn prefix``: every sample holds token 1 (the rows are streamed from the first batch on), and the last one
  starts with a prefix of 16 positions that its call attends both ways (token 2 first). Before, the summary then
  started again from the first sample; now it goes on, and nothing runs again.

    .venv/bin/python bench/turned_summary.py --seq-len 1024 --depth 8 --samples 8 --repeats 2 --turn bias \
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

MARK = 1  # the token whose texts add a term of their own
PREFIX, PREFIX_LEN = 2, 16  # a text that starts with it: its first positions attend each other both ways


def stack(depth: int) -> object:
    """D layers, each an SDPA call with ALiBi in its float mask, plus a term of the text in the last one; the last
    call's prefix seen both ways in a text that starts with PREFIX."""
    import torch
    from torch import nn

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(512, 256)
            self.qkv = nn.ModuleList(nn.Linear(256, 3 * 256) for _ in range(depth))
            self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
                                     for _ in range(depth))  # fmt: skip
            self.slopes = torch.tensor([2.0 ** (-2 * (h + 1)) for h in range(4)])[:, None, None]
            self.term = nn.Embedding(512, 4)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            b, t = ids.shape
            x = self.embed(ids)
            i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
            alibi = (-self.slopes * (i - j).abs()).masked_fill(j > i, float("-inf"))[None]  # (1, H, T, T)
            both = (ids[:, 0] == PREFIX)[:, None, None, None] & (i < PREFIX_LEN) & (j < PREFIX_LEN)  # (B, 1, T, T)
            marked = (ids == MARK).any(-1)[:, None, None, None]  # (B, 1, 1, 1)
            for layer, (qkv, mlp) in enumerate(zip(self.qkv, self.mlp, strict=True)):
                q, k, v = (z.view(b, t, 4, 64).transpose(1, 2) for z in qkv(x).split(256, -1))
                bias = alibi
                if layer == depth - 1:  # the text's own term, where it holds MARK; a prefix seen both ways
                    bias = alibi + torch.where(marked, 0.1 * self.term(ids).permute(0, 2, 1)[:, :, None, :], 0.0)
                    bias = torch.where(both, -self.slopes * (i - j).abs(), bias)
                a = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
                x = x + a.transpose(1, 2).reshape(b, t, 256)
                x = x + mlp(x)
            return x

    return Stack().eval()


def child(seq_len: int, depth: int, samples: int, turn: str, batch: int) -> dict[str, float]:
    import warnings

    import torch

    import biasviz

    torch.manual_seed(0)
    model = stack(depth)
    ids = torch.randint(PREFIX + 1, 512, (samples, seq_len), generator=torch.Generator().manual_seed(1))
    if turn == "bias":
        ids[-1, seq_len // 2] = MARK  # only the last text adds a term of its own
    else:
        ids[:, seq_len // 2] = MARK  # every text adds a term of its own: streamed from the first batch
        ids[-1, 0] = PREFIX  # the last one's prefix is seen both ways
    warnings.simplefilter("ignore")
    return timed_into_temporary(lambda out: biasviz.extract(model, ids, out, summary=True, progress=False,
                                                            batch_size=batch, layers=-1))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--turn", choices=("bias", "prefix"), default="bias")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--trees", type=Path, nargs=2, default=None, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.seq_len, args.depth, args.samples, args.turn, args.batch_size)))
        return
    trees = {"": None} if args.trees is None else {"before": args.trees[0], "after": args.trees[1]}
    what = ("the last one's bias of the text in the last sample" if args.turn == "bias"
            else "the last one's bias of the text in every sample, a prefix seen both ways in the last")  # fmt: skip
    print(f"{args.depth} SDPA layers, {what}; T = {args.seq_len}, N = {args.samples}, {args.batch_size} a batch, "
          f"exact maps, {args.repeats} interleaved repeats")  # fmt: skip
    options = ["--seq-len", str(args.seq_len), "--depth", str(args.depth), "--samples", str(args.samples),
               "--turn", args.turn, "--batch-size", str(args.batch_size)]  # fmt: skip
    for r in range(args.repeats):
        for label, tree in trees.items():
            env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree.resolve() / "src")}
            done = subprocess.run([sys.executable, __file__, "--child", *options], capture_output=True, text=True,
                                  check=True, env=env)  # fmt: skip
            got = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"repeat {r + 1}: {label:>6}: {got['s']:.2f} s, peak RSS {got['peak_gib']:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
