"""The key profile as a reducer (:mod:`biasviz.summaries.key_profile`): the weights by key, mean and spread over samples
and the queries that see each key, against numpy, from each sample's rows or from every sample's per-cell moments;
its sums added up under torchrun; named by the table and built with every summary."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.adapters.rows import RowBlock
from biasviz.store import datasets
from biasviz.store.datasets import KEY_PROFILE
from biasviz.summaries.key_profile import KeyProfile
from biasviz.summaries.reducers import build


@pytest.mark.parametrize("joint", [False, True])
def test_key_profile_counts_the_cells_each_block_brings(joint: bool) -> None:
    """The key profile's mean and spread by key over every (sample, query) pair that sees the key, against numpy:
    samples 0-2 in blocks that bring no cells (the causal triangle), samples 3-5 in blocks with their own (left
    padding of 0, 2 and 5): nothing set on the profile between them. ``joint``: a one-mask call's per-cell moments
    (one block for every sample, over the mask's rows), as rows formed again give them."""
    n, h, t, rows = 6, 2, 9, 4
    rng = np.random.default_rng(5)
    causal = np.tril(np.ones((t, t), bool))
    masks = np.stack([causal] * n)
    if joint:  # one mask for every sample: a window of 3
        masks[:] = causal & ~np.tril(np.ones((t, t), bool), -3)
    else:
        for a, pad in zip((3, 4, 5), (0, 2, 5), strict=True):
            masks[a, :, :pad] = False
            masks[a, :pad] = False
    w = np.where(masks[:, None], rng.random((n, h, t, t)), 0.0)
    profile = KeyProfile(samples=n, heads=h, seq_len=t, block=1, causal=True, device=torch.device("cpu"))
    for r0 in range(0, t, rows):
        r1 = min(t, r0 + rows)
        if joint:
            block = w[:, :, r0:r1, :r1]
            moments = torch.as_tensor(np.stack([block.mean(0), block.std(0)]))
            profile.add_moments(r0, moments, torch.as_tensor(masks[:1, None, r0:r1, :r1]))
            continue
        for first, own in ((0, False), (3, True)):
            cells = torch.as_tensor(masks[first : first + 3, None, r0:r1, :r1]) if own else None
            profile.add(RowBlock(0, first, r0, torch.as_tensor(w[first : first + 3, :, r0:r1, :r1]), attended=cells))
    got = profile.result()[KEY_PROFILE]
    for head in range(h):
        for j in range(t):
            seen = [w[a, head, i, j] for a in range(n) for i in range(t) if masks[a, i, j]]
            want = (np.mean(seen), np.std(seen)) if seen else (np.nan, np.nan)
            np.testing.assert_allclose(got[:, head, j], want, rtol=1e-5, atol=1e-7, err_msg=f"head {head}, key {j}")


def test_a_call_that_turns_to_every_key_counts_the_samples_before_by_the_causal_rule() -> None:
    """Samples 0-2 in blocks that bring no cells (the causal triangle), then the call turns to one that sees every key
    (:meth:`KeyProfile.widen`), and samples 3-5 come with their own cells, past the query too: every (sample, query)
    pair that sees a key counts, the samples before by the causal rule, against numpy. Without the widening, the
    samples before would be counted by the rule of every key."""
    n, h, t = 6, 2, 7
    rng = np.random.default_rng(8)
    masks = np.stack([np.tril(np.ones((t, t), bool))] * n)
    masks[3:, :3, :3] = True  # a prefix of 3 seen both ways
    masks[5] = True  # every key
    w = np.where(masks[:, None], rng.random((n, h, t, t)), 0.0)
    profile = KeyProfile(samples=n, heads=h, seq_len=t, block=1, causal=True, device=torch.device("cpu"))
    for r0 in range(0, t, 3):  # blocks of rows, keys up to the block's last row: the causal rule's
        r1 = min(t, r0 + 3)
        profile.add(RowBlock(0, 0, r0, torch.as_tensor(w[:3, :, r0:r1, :r1])))
    profile.widen()
    assert not profile.causal
    profile.add(RowBlock(0, 3, 0, torch.as_tensor(w[3:]), attended=torch.as_tensor(masks[3:, None])))
    got = profile.result()[KEY_PROFILE]
    for head in range(h):
        for j in range(t):
            seen = [w[a, head, i, j] for a in range(n) for i in range(t) if masks[a, i, j]]
            np.testing.assert_allclose(got[:, head, j], (np.mean(seen), np.std(seen)), rtol=1e-5, atol=1e-7,
                                       err_msg=f"head {head}, key {j}")  # fmt: skip


@pytest.mark.parametrize("joint", [False, True])
def test_key_profile_of_one_sample_in_float32_has_no_spread_where_one_query_sees_a_key(joint: bool) -> None:
    """One sample's float32 weights: the last key, seen by the last query alone, has a spread over queries of exactly
    0 (its square and its mean's square formed alike, in float64), whether it comes as per-cell moments (``joint``) or
    as the sample's own weights."""
    h, t = 3, 11
    rng = np.random.default_rng(3)
    w = torch.from_numpy(np.tril(rng.uniform(0.3, 0.9, (1, h, t, t)))).float()
    profile = KeyProfile(samples=1, heads=h, seq_len=t, block=1, causal=True, device=torch.device("cpu"))
    if joint:
        profile.add_moments(0, torch.cat([w, torch.zeros_like(w)]), None)
    else:
        profile.add(RowBlock(0, 0, 0, w))
    got = profile.profile()
    np.testing.assert_allclose(got[0, :, -1].numpy(), w[0, :, -1, -1].double().numpy(), rtol=0, atol=0)
    assert got[1, :, -1].tolist() == [0.0] * h


def test_key_profile_squares_a_block_a_few_rows_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block of per-cell moments larger than a step (here 2 heads x 7 keys, a step of 20 cells: 1 row) is squared
    a step of rows at a time: the same mean and spread by key as numpy's over the block's cells."""
    import biasviz.summaries.key_profile as key_profile

    monkeypatch.setattr(key_profile, "WIDE_CELLS", 20)
    h, t = 2, 7
    rng = np.random.default_rng(11)
    mean, std = np.tril(rng.uniform(0.1, 0.9, (2, h, t, t)))
    profile = KeyProfile(samples=3, heads=h, seq_len=t, block=1, causal=True, device=torch.device("cpu"))
    profile.add_moments(0, torch.from_numpy(np.stack([mean, std])).float(), None)
    got = profile.result()[KEY_PROFILE]
    mean, std = mean.astype(np.float32).astype(np.float64), std.astype(np.float32).astype(np.float64)
    for j in range(t):
        seen = slice(j, t)  # the queries i >= j
        want_mean = mean[:, seen, j].mean(-1)
        want_std = np.sqrt((std[:, seen, j] ** 2 + mean[:, seen, j] ** 2).mean(-1) - want_mean**2)
        np.testing.assert_allclose(got[:, :, j], [want_mean, want_std], rtol=1e-6, atol=1e-7, err_msg=f"key {j}")


def test_processes_add_their_sums_and_counts() -> None:
    """torchrun: process 0 streams samples 0-2 with no cells of their own, process 1 samples 3-4 with theirs (left
    padding of 2 and 4); joined, the profile of every (sample, query) pair that sees each key: each divides by N over
    every process, not its own."""
    n, h, t = 5, 2, 8
    rng = np.random.default_rng(8)
    masks = np.stack([np.tril(np.ones((t, t), bool))] * n)
    for a, pad in ((3, 2), (4, 4)):
        masks[a, :, :pad], masks[a, :pad] = False, False
    w = np.where(masks[:, None], rng.random((n, h, t, t)), 0.0)
    sizes = {"heads": h, "seq_len": t, "block": 1, "causal": True, "device": torch.device("cpu"), "total": n}
    parts = [KeyProfile(samples=3, **sizes), KeyProfile(samples=2, **sizes)]
    for part, first, own in ((parts[0], 0, False), (parts[1], 3, True)):
        for r0 in range(0, t, 3):
            r1 = min(t, r0 + 3)
            rows = slice(first, first + part.samples)
            cells = torch.as_tensor(masks[rows, None, r0:r1, :r1]) if own else None
            part.add(RowBlock(0, first, r0, torch.as_tensor(w[rows, :, r0:r1, :r1]), attended=cells))
    joined = KeyProfile(samples=3, **sizes)
    joined.join([p.state() for p in parts])
    got = joined.result()[KEY_PROFILE]
    for head in range(h):
        for j in range(t):
            seen = [w[a, head, i, j] for a in range(n) for i in range(t) if masks[a, i, j]]
            np.testing.assert_allclose(got[:, head, j], (np.mean(seen), np.std(seen)), rtol=1e-5, atol=1e-7)


def test_the_table_names_it_and_every_summary_builds_it() -> None:
    assert KEY_PROFILE in datasets.reduced_rows() and KEY_PROFILE not in datasets.MEASURE_ROWS
    built = build(samples=2, heads=1, seq_len=4, block=1, causal=True, device=torch.device("cpu"), measures=False)
    assert KeyProfile in [type(r) for r in built] and all(r.moments == isinstance(r, KeyProfile) for r in built)
