"""A summary of a model that attends through ``flex_attention``: time and peak RSS of ``biasviz.extract(summary=True)``
through the public call, each run in a fresh process, interleaved (BENCHMARKS.md §8). One layer (hidden 256, 4 heads,
random weights) whose score_mod adds ALiBi, -slope_h·(i - j), as attention-gym writes it, over a causal block mask
(``--bias keys``: BLOOM's m_h·j instead; ``--bias none``: the block mask alone), N = 3 windows of T tokens in one
batch. What a summary's forward keeps of the call (its mask and bias) is what this measures.

``--trees BEFORE AFTER``: each run by two versions of biasviz in turn (their ``src`` first on ``PYTHONPATH``).

    .venv/bin/python bench/flex_summary.py --seq-len 2048 --repeats 3 --trees /path/to/old/checkout .
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

SAMPLES, HEADS, WIDTH = 3, 4, 64


def flex_layer(bias: str) -> object:
    """One flex_attention layer adding ``bias`` ("alibi", "keys" or "none") in its score_mod, causal block mask."""
    import torch

    class FlexLayer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(512, HEADS * WIDTH)
            self.qkv = torch.nn.Linear(HEADS * WIDTH, 3 * HEADS * WIDTH)
            self.slopes = torch.tensor([2.0 ** (-2 * (h + 1)) for h in range(HEADS)])

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            b, t = ids.shape
            parts = self.qkv(self.embed(ids)).split(HEADS * WIDTH, -1)
            q, k, v = (z.view(b, t, HEADS, WIDTH).transpose(1, 2) for z in parts)
            slopes = self.slopes

            def score_mod(score, batch, h, i, j):  # noqa: ANN001, ANN202 - flex's score_mod signature
                if bias == "alibi":
                    return score - slopes[h] * (i - j)
                return score + slopes[h] * j if bias == "keys" else score

            def causal(batch, h, i, j):  # noqa: ANN001, ANN202 - flex's mask_mod signature
                return j <= i

            mask = create_block_mask(causal, None, None, t, t, device=str(ids.device))
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask)

    return FlexLayer().eval()


def child(seq_len: int, bias: str) -> dict[str, float]:
    import warnings

    import torch

    import biasviz

    torch.manual_seed(0)
    model = flex_layer(bias)
    ids = torch.randint(1, 512, (SAMPLES, seq_len), generator=torch.Generator().manual_seed(1))
    warnings.simplefilter("ignore")
    return timed_into_temporary(lambda out: biasviz.extract(model, ids, out, summary=True, progress=False,
                                                            batch_size=SAMPLES, resolution=256))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bias", choices=("alibi", "keys", "none"), default="alibi")
    parser.add_argument("--trees", type=Path, nargs=2, default=None, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.seq_len, args.bias)))
        return
    trees = {"": None} if args.trees is None else {"before": args.trees[0], "after": args.trees[1]}
    print(f"flex_attention layer, {args.bias} in its score_mod, T = {args.seq_len}, R = 256, N = {SAMPLES} in one "
          f"batch, {args.repeats} interleaved repeats")  # fmt: skip
    for r in range(args.repeats):
        for label, tree in trees.items():
            env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree.resolve() / "src")}
            done = subprocess.run([sys.executable, __file__, "--child", "--seq-len", str(args.seq_len), "--bias",
                                   args.bias], capture_output=True, text=True, check=True, env=env)  # fmt: skip
            got = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"repeat {r + 1}: {label:>6}: {got['s']:.2f} s, peak RSS {got['peak_gib']:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
