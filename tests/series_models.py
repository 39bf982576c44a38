"""Tiny random GPT-NeoX (Pythia's architecture) and BLOOM models saved as checkpoint series: as revisions in a
Hugging Face hub cache laid out by hand (models--ORG--NAME/{blobs, snapshots/COMMIT, refs/REVISION}, what
``hf download ORG/NAME --revision REV`` leaves), or as sub-folders named as training frameworks name them."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import torch

VOCAB = 300  # every byte has an id: text is read as UTF-8 bytes, no tokenizer needed


def tiny_neox(seed: int) -> torch.nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(seed)
    config = GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                           intermediate_size=64, max_position_embeddings=128)  # fmt: skip
    return GPTNeoXForCausalLM(config).eval()


def tiny_bloom(seed: int) -> torch.nn.Module:
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(seed)
    return BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)).eval()


def save_revision(cache: Path, repo_id: str, revision: str, model: torch.nn.Module) -> Path:
    """Save ``model`` as ``revision`` of ``repo_id`` in the hub cache at ``cache``; returns its snapshot folder.

    Files go to blobs/ under their SHA-256 (what the hub names large files by), the snapshot links to them,
    and refs/REVISION holds the commit (here: a digest of the revision's files).
    """
    org, name = repo_id.split("/")
    repo = cache / f"models--{org}--{name}"
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
    digests = {n: hashlib.sha256(data).hexdigest() for n, data in files.items()}
    commit = hashlib.sha1("".join(f"{n} {d}\n" for n, d in sorted(digests.items())).encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for n, data in files.items():
        blob = repo / "blobs" / digests[n]
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / n)
    ref = repo / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)
    return snapshot
