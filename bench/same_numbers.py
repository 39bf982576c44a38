"""Whether two versions of biasviz write the same numbers: the same files made by each, compared dataset by dataset.

For a change that should move no number (a refactor), run both source trees on the same inputs, each in a process of
its own, and compare every dataset and attribute of the files they write: exactly (bit for bit), and where they
differ, by how much. The inputs: our models trained on the built-in default corpus (the Python standard library's
source; ``biasviz train``, once, by the first tree), whose windows ``biasviz extract`` cuts from it, as summaries and as
full files, through the command line users call; and two transformers models (a Llama through SDPA, whose rows are
formed again, and a Bloom with ALiBi, streamed as it forms them, each also with samples padded differently; and a
Mistral with a sliding window, through SDPA and streamed through its eager softmax), randomly initialised and saved
locally, through ``biasviz.extract``. Nothing is downloaded.

    .venv/bin/python bench/same_numbers.py --before /path/to/old/checkout --after .
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

SCHEMES = ("alibi", "rope", "kerple-log")  # our models on the default corpus
TRANSFORMERS = ("llama", "bloom", "mistral")
# the transformers models' inputs: every sample whole; and (padded) samples left-padded by different lengths, so that
# each is masked otherwise (its own attended cells, in rows formed again (Llama) and streamed (Bloom)); Mistral's
# sliding window of 24 is one mask for every sample, in rows formed again (sdpa) and streamed (eager, in two batches);
# the Llama padded and streamed through its eager softmax: each sample's own cells beside the rotary measures; and a
# full file of it (-full): the weights as the model formed them, the uniform rows of queries with no key included
INPUTS = {"llama": ("summary", "full", "padded", "eager-padded", "eager-padded-full"),
          "bloom": ("summary", "full", "padded"), "mistral": ("summary", "eager")}
# attributes that say when or how long, not what: they differ from run to run
VOLATILE = ("created", "seconds", "elapsed", "biasviz_version", "git", "host", "wall")
REFERENCES = ("DIMENSION_LIST", "REFERENCE_LIST")  # HDF5 object references: addresses within each file

CHILD = r"""
import sys, numpy as np, torch, biasviz
kind, path, out = sys.argv[1:4]
if kind == "build":
    torch.manual_seed(0)
    if path.endswith("llama"):
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                             num_hidden_layers=2, intermediate_size=128, vocab_size=256,
                                             attn_implementation="sdpa"))
    elif path.endswith("mistral"):
        from transformers import MistralConfig, MistralForCausalLM
        model = MistralForCausalLM(MistralConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                                 num_hidden_layers=2, intermediate_size=128, vocab_size=256,
                                                 sliding_window=24, attn_implementation="sdpa"))
    else:
        from transformers import BloomConfig, BloomForCausalLM
        model = BloomForCausalLM(BloomConfig(vocab_size=256, hidden_size=64, n_layer=2, n_head=4))
    model.save_pretrained(path)
    raise SystemExit
ids = np.random.default_rng(0).integers(1, 256, size=(5, 96))
summary = {"summary": True, "resolution": 24} if kind in ("summary", "padded", "eager", "eager-padded") else {}
if kind.removesuffix("-full") in ("padded", "eager-padded"):  # token 0 pads the first 0, 7, 14, ... of each sample
    from transformers import AutoModelForCausalLM
    for a in range(len(ids)):
        ids[a, : 7 * a] = 0
    attention = {"attn_implementation": "eager"} if kind.startswith("eager") else {}
    model = AutoModelForCausalLM.from_pretrained(path, **attention).eval()
    forward = lambda batch: model(batch, attention_mask=(batch != 0).long())
    biasviz.extract(model, ids, out, layers="all", progress=False, forward=forward, batch_size=2, **summary)
elif kind == "eager":  # the softmax as the model writes it: streamed
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    biasviz.extract(model, ids, out, layers="all", progress=False, batch_size=2, **summary)
else:
    biasviz.extract(path, ids, out, layers="all", progress=False, **summary)
"""


def run(tree: Path, args: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(args)} failed in {tree}:\n{done.stderr[-3000:]}")


def make_files(tree: Path, work: Path, out: Path, python: str) -> None:
    """Every file of the comparison, by ``tree``'s biasviz, into ``out``."""
    out.mkdir(parents=True)
    for scheme in SCHEMES:
        model = work / "runs" / scheme
        for kind, extra in (("summary", ["--summary", "--resolution", "32"]), ("full", [])):
            run(tree, [python, "-m", "biasviz", "extract", "--model", str(model), "--layer", "all", "--samples", "4",
                       "--seq-len", "128", *extra, "--out", str(out / f"{scheme}-{kind}.h5")], work)  # fmt: skip
    for name in TRANSFORMERS:
        for kind in INPUTS[name]:
            run(tree, [python, "-c", CHILD, kind, str(work / "hf" / name), str(out / f"{name}-{kind}.h5")], work)


def walk(f: h5py.File) -> dict[str, object]:
    """Every dataset's values and every attribute (of the root, groups and datasets) by path."""
    items: dict[str, object] = {}

    def visit(name: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset):
            items[name] = obj[()]
        for key, value in obj.attrs.items():
            if not any(word in key for word in VOLATILE) and key not in REFERENCES:
                items[f"{name}@{key}"] = value

    for key, value in f.attrs.items():
        if not any(word in key for word in VOLATILE):
            items[f"@{key}"] = value
    f.visititems(visit)
    return items


def compare(a: Path, b: Path) -> tuple[int, list[str]]:
    """(items compared, what differs) between two files."""
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        x, y = walk(fa), walk(fb)
    said = [f"only before: {k}" for k in sorted(x.keys() - y.keys())]
    said += [f"only after: {k}" for k in sorted(y.keys() - x.keys())]
    for key in sorted(x.keys() & y.keys()):
        u, v = np.asarray(x[key]), np.asarray(y[key])
        if u.dtype != v.dtype or u.shape != v.shape:
            said.append(f"{key}: {u.dtype}{u.shape} against {v.dtype}{v.shape}")
        elif u.dtype.kind == "O":  # strings
            if u.tolist() != v.tolist():
                said.append(f"{key}: differs")
        elif u.dtype.names is not None or u.dtype.kind not in "fc":
            if u.tobytes() != v.tobytes():
                said.append(f"{key}: differs")
        elif not np.array_equal(u, v, equal_nan=True):
            gap = np.nanmax(np.abs(u.astype(np.float64) - v.astype(np.float64)))
            said.append(f"{key}: max |difference| {gap:.3g}")
    return len(x.keys() & y.keys()), said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the checkout whose numbers stand")
    parser.add_argument("--after", type=Path, required=True, help="the checkout to compare with it")
    parser.add_argument("--steps", type=int, default=60, help="training steps of our models")
    parser.add_argument("--work", type=Path, help="keep the models and files here (and reuse its models)")
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work.resolve() if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for label in ("before", "after"):
            shutil.rmtree(work / label, ignore_errors=True)
        for scheme in SCHEMES:  # trained once, by the first tree, on the default corpus
            if (work / "runs" / scheme / "model.safetensors").exists():
                continue
            train = ["train", "--scheme", scheme, "--preset", "tiny", "--steps", str(args.steps)]
            run(args.before.resolve(), [python, "-m", "biasviz", *train, "--out", str(work / "runs" / scheme)], work)
        for name in TRANSFORMERS:
            if (work / "hf" / name).exists():
                continue
            run(args.before.resolve(), [python, "-c", CHILD, "build", str(work / "hf" / name), ""], work)
        for label, tree in (("before", args.before), ("after", args.after)):
            make_files(tree.resolve(), work, work / label, python)
        total, bad = 0, 0
        for a in sorted((work / "before").glob("*.h5")):
            n, said = compare(a, work / "after" / a.name)
            total += n
            bad += any(not s.startswith("only after") for s in said)
            print(f"{a.name}: {n} datasets and attributes compared, {'identical' if not said else 'see below'}")
            for line in said:
                print(f"    {line}")
        print(f"{total} items in {len(list((work / 'before').glob('*.h5')))} files; {bad} files with a difference "
              "beyond datasets the after version adds")  # fmt: skip
        raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
