"""End to end, as a user runs them: `biasviz extract` against a naive transformers + h5py script.

Both start a fresh Python, load a GPT-2-small-shaped model from disk, run 4 samples x 512 tokens and
write the final layer to HDF5; wall time of the whole process (imports, loading, reading text,
running, writing), median of ``--runs``. The naive script is what a researcher writes without a tool:

    model = GPT2LMHeadModel.from_pretrained(DIR, attn_implementation="eager")
    attn = model(ids, output_attentions=True).attentions[11]        # all 12 layers are formed
    h5py.File(OUT, "w").create_dataset("weights", data=attn.numpy(), compression="gzip")

It reads its 4 x 512 tokens from the same text file with the same tokenizer. biasviz extracts the same
saved GPT-2 (weights only: GPT-2 adds no bias) and, in a second row, biasviz's own ALiBi model of the
same shape (bias and weights: twice the data).

    .venv/bin/python bench/extract_vs_naive.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIASVIZ = Path(sys.executable).with_name("biasviz")
SAMPLES, SEQ_LEN = 4, 512

NAIVE = textwrap.dedent(
    """
    import sys
    import h5py, torch
    from tokenizers import Tokenizer
    from transformers import GPT2LMHeadModel

    model_dir, text, out = sys.argv[1:4]
    tok = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    ids = tok.encode(open(text, encoding="utf-8").read()).ids[: 4 * 512]
    ids = torch.tensor(ids).reshape(4, 512)
    model = GPT2LMHeadModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        attn = model(ids, output_attentions=True).attentions[11]  # (4, 12, 512, 512)
    with h5py.File(out, "w") as f:
        f.create_dataset("input_ids", data=ids.numpy())
        f.create_dataset("weights", data=attn.numpy(), compression="gzip", chunks=(1, 1, 512, 512))
    """
)


def make_models(root: Path) -> tuple[Path, Path, Path]:
    """A saved GPT-2-small (random weights), biasviz's ALiBi model of that shape, a tokenizer and a text."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from biasviz.data import build_tokenizer, save_tokenizer
    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

    stdlib = sorted(Path(textwrap.__file__).parent.glob("[a-c]*.py"))
    text = "".join(p.read_text(encoding="utf-8") for p in stdlib)
    (root / "text.txt").write_text(text, encoding="utf-8")
    tok = build_tokenizer([text], 50257)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=tok.get_vocab_size())
    GPT2LMHeadModel(config).save_pretrained(root / "gpt2")
    save_tokenizer(tok, root / "gpt2")
    ours = BiasGPTConfig.from_preset("gpt2-small", "alibi", vocab_size=tok.get_vocab_size())
    BiasGPTForCausalLM(ours).save_pretrained(root / "alibi")
    save_tokenizer(tok, root / "alibi")
    return root / "gpt2", root / "alibi", root / "text.txt"


def timed(cmd: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        gpt2, alibi, text = make_models(root)
        (root / "naive.py").write_text(NAIVE)
        common = ["--text", str(text), "--samples", str(SAMPLES), "--seq-len", str(SEQ_LEN), "--device", "cpu",
                  "--quiet", "--force"]  # fmt: skip
        rows = {
            "naive transformers + h5py (weights)": [sys.executable, str(root / "naive.py"), str(gpt2), str(text),
                                                    str(root / "naive.h5")],  # fmt: skip
            "biasviz extract, transformers GPT-2 (weights)": [str(BIASVIZ), "extract", "--model", str(gpt2),
                                                              "--out", str(root / "g.h5"), *common],  # fmt: skip
            "biasviz extract, ALiBi model (bias + weights)": [str(BIASVIZ), "extract", "--model", str(alibi),
                                                              "--out", str(root / "a.h5"), *common],  # fmt: skip
        }
        print(f"{SAMPLES} samples x {SEQ_LEN} tokens, final layer, GPT-2-small shape, CPU, {args.runs} runs "
              "(wall time of the whole process)\n")  # fmt: skip
        print("| command | s, median [min-max] | file MiB |\n| --- | --- | --- |")
        for name, cmd in rows.items():
            times = timed(cmd, args.runs)
            size = Path(cmd[cmd.index("--out") + 1] if "--out" in cmd else cmd[-1]).stat().st_size / 2**20
            print(f"| {name} | {statistics.median(times):.2f} [{min(times):.2f}-{max(times):.2f}] | {size:.1f} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
