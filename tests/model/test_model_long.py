"""Our own models at T = 8192: the attention forms its bias and weights in blocks of query rows, never (H, T, T).

One 1-layer, 12-head model per scheme runs a forward pass at T = 8192 with hooks that keep a few hundred
sampled cells of each block (never the matrix: a dense (12, T, T) float32 tensor is 3.2 GB, and one head's
(T, T) 268 MB). The sampled bias must follow each scheme's formula, computed here from the module's parameters
and the definitions (docs/schemes.md), and the sampled weight rows must sum to 1 and be 0 past the diagonal. The
forward passes run in two child processes, so that each one's peak resident memory (``resource.getrusage``) is
its own; what the forwards add to it stays under half of one head's (T, T) matrix. (At T = 8192 the query rows
still split into hundreds of blocks of BLOCK_ELEMENTS: the code path is the one of any longer T, at a quarter of
the 16384-token forwards' time.)
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from biasviz.model.attention import BLOCK_ELEMENTS

pytestmark = pytest.mark.slow

T = 8192  # 64 times the tiny models' training length; the code path is the same at any T
H = 12
SCHEMES = ("alibi", "kerple-log", "fire", "t5")
CELLS_PER_BLOCK = 300  # sampled bias cells per block (about 400 blocks)
PEAK_LIMIT_GIB = 1.0  # 0.5 GiB measured each time (the interpreter, torch and transformers included)


def _sampled_forward(scheme: str, ids: torch.Tensor) -> dict:
    """One forward of a 1-layer model; the hooks keep samples of each block, never a block itself."""
    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM, capture

    options = {"hidden": 8} if scheme == "fire" else {}  # a quarter of the default MLP: the formula is the same
    config = BiasGPTConfig(scheme=scheme, n_layer=1, n_head=H, n_embd=24, vocab_size=97, n_positions=256,
                           scheme_options=options)  # fmt: skip
    model = BiasGPTForCausalLM(config).eval()  # head dim 2
    g = torch.Generator().manual_seed(1)
    bias_cells: list[torch.Tensor] = []  # rows (h, i, j, value)
    row_sums: list[torch.Tensor] = []  # (H,) per sampled weight row
    past_diagonal = [0.0]  # the largest weight past the diagonal in any block
    shapes: list[tuple[int, int]] = []  # (rows, keys) of every bias block

    def keep(t: torch.Tensor, name: str, row0: int) -> None:
        rows, keys = t.shape[-2:]
        assert keys == row0 + rows  # a causal query block sees no later key
        if name.endswith("hook_bias"):  # (1, H, rows, keys)
            shapes.append((rows, keys))
            h = torch.randint(0, H, (CELLS_PER_BLOCK,), generator=g)
            local = torch.randint(0, rows, (CELLS_PER_BLOCK,), generator=g)
            i = row0 + local
            j = (torch.rand(CELLS_PER_BLOCK, generator=g, dtype=torch.float64) * (i + 1)).long().clamp(max=i)
            value = t[0, h, local, j].double()
            bias_cells.append(torch.stack([h.double(), i.double(), j.double(), value], dim=1))
        else:  # weights (1, H, rows, keys)
            local = int(torch.randint(0, rows, (1,), generator=g))
            row_sums.append(t[0, :, local].double().sum(-1))  # (H,)
            square = t[0, :, :, row0:]  # (H, rows, rows): the only keys a block masks
            above = square[:, torch.ones(rows, rows, dtype=torch.bool).triu(1)]
            past_diagonal[0] = max(past_diagonal[0], float(above.abs().max()) if above.numel() else 0.0)

    with torch.inference_mode(), capture(model, ["blocks.0.attn.hook_bias", "blocks.0.attn.hook_pattern"], keep):
        model(ids)
    return {
        "state": {k: v.clone() for k, v in model.blocks[0].attn.pos_bias.state_dict().items()},
        "cells": torch.cat(bias_cells),
        "row_sums": torch.stack(row_sums),
        "past_diagonal": past_diagonal[0],
        "shapes": shapes,
    }


def _own_peak_gib() -> float:
    """This process's peak resident memory: VmHWM belongs to the image exec started, whereas ru_maxrss keeps the
    high-water mark of the forked parent (a pytest process gigabytes large after a long suite)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 2**30  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # Linux: KiB


def _own_resident_gib() -> float:
    """This process's resident memory now (VmRSS); 0 where /proc is missing, so that the whole peak counts as added."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 2**30  # kB
    return 0.0


def _child(out: Path, schemes: list[str]) -> None:
    """Run ``schemes``' models at T on one thread; save the samples, the schemes' parameters and the peak memory."""
    torch.set_num_threads(1)  # two children share the two cores: no thread of one waits on the other's
    torch.manual_seed(0)
    ids = torch.randint(0, 97, (1, T))
    for scheme in schemes:  # every module the forwards import, loaded (and, in a fresh clone, compiled) first
        _sampled_forward(scheme, ids[:, :256])
    before = _own_resident_gib()  # the interpreter, torch, transformers, biasviz: what the forwards start from
    t0 = time.perf_counter()
    results = {scheme: _sampled_forward(scheme, ids) for scheme in schemes}
    peak = _own_peak_gib()
    torch.save({"results": results, "peak_gib": peak, "added_gib": peak - before,
                "seconds": time.perf_counter() - t0}, out)  # fmt: skip


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The schemes split over two child processes running side by side (FIRE's MLP makes it the slowest)."""
    where = tmp_path_factory.mktemp("long")
    root = Path(__file__).resolve().parents[2]
    groups = [["fire", "alibi"], ["kerple-log", "t5"]]
    # glibc's adaptive mmap threshold makes the peak RSS of one and the same sequence of allocations vary from
    # run to run (0.6 to 5.2 GiB measured for these children); a fixed threshold gives back every freed block,
    # so the peak measured is the code's own (0.5 GiB each time)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    children = [
        subprocess.Popen([sys.executable, __file__, str(where / f"{n}.pt"), *group], cwd=root,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for n, group in enumerate(groups)
    ]  # fmt: skip
    for child in children:
        _, err = child.communicate(timeout=600)
        assert child.returncode == 0, err[-3000:]
    parts = [torch.load(where / f"{n}.pt", weights_only=False) for n in range(len(groups))]
    results = {scheme: r for part in parts for scheme, r in part["results"].items()}
    assert sorted(results) == sorted(SCHEMES)
    return {"results": results, "peak_gib": max(p["peak_gib"] for p in parts),
            "added_gib": max(p["added_gib"] for p in parts), "seconds": [p["seconds"] for p in parts]}  # fmt: skip


def test_peak_memory_stays_far_below_one_dense_matrix(long_run: dict) -> None:
    dense_gib = H * T * T * 4 / 2**30  # 3 GiB (3.2 GB): one (H, T, T) float32 tensor
    head_gib = dense_gib / H  # 0.25 GiB: one head's (T, T) float32 matrix
    assert long_run["peak_gib"] < PEAK_LIMIT_GIB, long_run
    assert long_run["added_gib"] < head_gib / 2 < dense_gib / 10, long_run  # 0.04 GiB measured
    for scheme in SCHEMES:
        shapes = long_run["results"][scheme]["shapes"]
        assert sum(rows for rows, _ in shapes) == T  # every query row, in blocks
        assert all(H * rows * keys <= BLOCK_ELEMENTS or rows == 1 for rows, keys in shapes)  # a few MiB per block


def _cells(long_run: dict, scheme: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
    r = long_run["results"][scheme]
    cells = r["cells"].numpy()
    h, i, j = (cells[:, n].astype(np.int64) for n in range(3))
    assert len(cells) > 100_000 and (i - j).max() > T - 1000  # far distances are sampled too
    return h, i, j, cells[:, 3], {k: v.double().numpy() for k, v in r["state"].items()}


def test_alibi_cells_are_minus_slope_times_distance(long_run: dict) -> None:
    h, i, j, got, _ = _cells(long_run, "alibi")
    slopes = 2.0 ** (-8.0 * (h + 1) / H)  # m_h = 2^(-8h/H), h 1-based
    np.testing.assert_allclose(got, -slopes * (i - j), rtol=1e-6, atol=1e-6)


def test_kerple_log_cells_follow_the_formula(long_run: dict) -> None:
    h, i, j, got, state = _cells(long_run, "kerple-log")
    r1, r2 = np.maximum(state["r1"], 0.01), np.maximum(state["r2"], 0.01)
    np.testing.assert_allclose(got, -r1[h] * np.log1p(r2[h] * (i - j)), rtol=1e-5, atol=1e-5)


def test_fire_cells_follow_the_formula(long_run: dict) -> None:
    h, i, j, got, state = _cells(long_run, "fire")
    c, big_l = max(float(state["c"]), 1e-4), max(float(state["threshold"]), 1.0)
    psi = lambda x: np.log(c * x + 1.0)  # noqa: E731
    u = psi(i - j) / psi(np.maximum(big_l, i))  # in [0, 1]
    hidden = np.maximum(u[:, None] * state["mlp.0.weight"][:, 0] + state["mlp.0.bias"], 0.0)  # (cells, hidden)
    want = np.einsum("nk,nk->n", hidden, state["mlp.2.weight"][h]) + state["mlp.2.bias"][h]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_t5_cells_are_the_table_at_transformers_bucket(long_run: dict) -> None:
    h, i, j, got, state = _cells(long_run, "t5")
    d = torch.from_numpy(i - j)
    bucket = T5Attention._relative_position_bucket(-d, bidirectional=False, num_buckets=32, max_distance=128)
    np.testing.assert_array_equal(got, state["table.weight"][bucket.numpy(), h].astype(np.float32))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_weight_rows_sum_to_one_and_nothing_lies_past_the_diagonal(long_run: dict, scheme: str) -> None:
    r = long_run["results"][scheme]
    sums = r["row_sums"].numpy()
    assert len(sums) == len(r["shapes"])  # one sampled row per block
    np.testing.assert_allclose(sums, 1.0, atol=1e-4)
    assert r["past_diagonal"] == 0.0


if __name__ == "__main__":
    _child(Path(sys.argv[1]), sys.argv[2:])
