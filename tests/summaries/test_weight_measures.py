"""docs/position-measures.md's weight measures against the definitions written out cell by cell in float64 (numpy
loops), for causal, bidirectional and windowed masks, rows given in blocks and samples in batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.adapters.rows import RowBlock
from biasviz.store.datasets import distance_bins
from biasviz.summaries import weight_measures
from biasviz.summaries.weight_measures import WeightMeasures, sample_stats
from tests.measures_reference import reference as _reference
from tests.measures_reference import sink_ranking


def _weights(rng: np.random.Generator, n: int, h: int, t: int, mask: np.ndarray) -> np.ndarray:
    """Softmax rows over the attended cells of ``mask`` (h or 1, t, t); 0 elsewhere."""
    logits = rng.normal(size=(n, h, t, t)) * 2
    logits = np.where(mask[None], logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


def _run(w: np.ndarray, mask: np.ndarray | None, causal: bool, block: int, rows: int, batch: int) -> dict:
    n, h, t, _ = w.shape
    cells = None if mask is None else torch.as_tensor(mask)[None]  # the call's one mask, every block's rows of it
    wm = WeightMeasures(samples=n, heads=h, seq_len=t, block=block, causal=causal, device=torch.device("cpu"))
    # the replay order: row blocks outside, samples inside; keys up to the block's last row when causal
    for r0 in range(0, t, rows):
        r1 = min(t, r0 + rows)
        keys = r1 if causal else t
        for first in range(0, n, batch):
            weights = torch.as_tensor(w[first : first + batch, :, r0:r1, :keys], dtype=torch.float32)
            wm.add(RowBlock(0, first, r0, weights, attended=None if cells is None else cells[..., r0:r1, :keys]))
    return wm.result()


CASES = {
    "causal": (lambda t: np.tril(np.ones((1, t, t), bool)), True, None),
    "bidirectional": (lambda t: np.ones((1, t, t), bool), False, None),
    # a sliding window of 12 (Mistral's rule: i - j < 12), and a per-head mask (head 1 window 3: no query sees 10 keys)
    "window": (lambda t: np.stack([np.tril(np.ones((t, t), bool)) & ~np.tril(np.ones((t, t), bool), -12),
                                   np.tril(np.ones((t, t), bool)) & ~np.tril(np.ones((t, t), bool), -3)]),
               True, "model"),
}  # fmt: skip


@pytest.mark.parametrize("entropy_in_parts", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_measures_match_definitions(case: str, entropy_in_parts: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``entropy_in_parts``: the entropy of each block worked a row at a time, as for long rows."""
    if entropy_in_parts:
        monkeypatch.setattr(weight_measures, "ENTROPY_BYTES", 1)
    make, causal, own = CASES[case]
    n, h, t, block = 4, 2, 37, 5
    mask = make(t)
    w = _weights(np.random.default_rng(3), n, h, t, mask)
    ref = _reference(w, mask, block)
    got = _run(w, mask if own else None, causal, block, rows=11, batch=3)
    for name in ("band_mass", "context_mass", "weights_entropy"):
        x = ref[name]
        np.testing.assert_allclose(got[name][0], x.mean(0), rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(got[name][1], x.std(0), rtol=1e-4, atol=1e-6, err_msg=name)
        se = np.sqrt(((x - x.mean(0)) ** 2).sum(0) / (n * (n - 1)))
        np.testing.assert_allclose(got[f"{name}_se"], se, rtol=1e-4, atol=1e-6, err_msg=name)
    # every qualifying query puts all its weight in the ten segments
    sums = got["context_mass"][0].sum(-1)
    np.testing.assert_allclose(sums[np.isfinite(sums)], 1.0, atol=1e-5)
    assert np.isfinite(sums).sum() == (1 if case == "window" else 2)
    recv = ref["received"]
    index, share, least = sink_ranking(recv, ref["seen"])
    np.testing.assert_array_equal(np.sort(got["sink_keys"]["index"], -1), np.sort(index, -1))
    np.testing.assert_allclose(got["sink_keys"]["share"], share, rtol=1e-5)
    assert np.all(got["sink_min_queries"] == least)
    loo = np.stack([np.delete(recv, a, 0).mean(0) for a in range(n)])  # jackknife from scratch
    jack = np.sqrt((n - 1) / n * ((loo - loo.mean(0)) ** 2).sum(0))
    np.testing.assert_allclose(got["weights_key_profile_se"], jack, rtol=1e-4, atol=1e-7)


def test_band_mass_sums_to_one_per_query() -> None:
    """Every query puts all its weight in the bins: the bins' masses times the queries that have keys in them
    (T - first distance, causal) sum to the number of queries."""
    t = 40
    mask = np.tril(np.ones((1, t, t), bool))
    w = _weights(np.random.default_rng(0), 1, 1, t, mask)
    wm = WeightMeasures(samples=1, heads=1, seq_len=t, block=1, causal=True, device=torch.device("cpu"))
    wm.add(RowBlock(0, 0, 0, torch.as_tensor(w, dtype=torch.float32)))
    mass = wm.result()["band_mass"][0, 0]
    assert float((mass * (t - distance_bins(t)[:, 0])).sum()) == pytest.approx(t, rel=1e-5)


def test_no_standard_error_below_three_samples() -> None:
    stats, se = sample_stats(torch.rand(2, 3))
    assert se is None and stats.shape == (2, 3)
    assert sample_stats(torch.rand(3, 3))[1] is not None


def test_distance_bins_cover_every_distance_once() -> None:
    for t in (1, 5, 16, 17, 100, 2048, 32768):
        bins = distance_bins(t)
        assert bins[0, 0] == 0 and bins[-1, 1] == t - 1
        assert (bins[1:, 0] == bins[:-1, 1] + 1).all() and (bins[:, 1] >= bins[:, 0]).all()
    # the edges of docs/position-measures.md at T = 2048: e_k = round(16 * 128 ** (k / 48))
    edges = sorted({int(np.floor(16 * 128 ** (k / 48) + 0.5)) for k in range(49)})
    assert distance_bins(2048)[16:, 0].tolist() == edges[:-1]


def test_95_intervals_cover_the_true_mean_in_93_to_97_percent_of_400_runs() -> None:
    """Synthetic weights with a known expectation: each query's row drawn from a Dirichlet of equal parameters over
    the keys it sees (E w(i, j) = 1 / (i + 1)), N = 40 texts a run. The stored band mass at distance 0 and its SE
    give mean ± 1.96 SE; over 400 runs it covers the true mean (the mean over queries of 1 / (i + 1)) in 93-97 %."""
    t, n, runs = 12, 40, 400
    rng = np.random.default_rng(2026)
    truth = np.mean([1.0 / (i + 1) for i in range(t)])
    covered = 0
    for _ in range(runs):
        w = np.zeros((n, 1, t, t))
        for i in range(t):
            w[:, 0, i, : i + 1] = rng.dirichlet(np.full(i + 1, 4.0), size=n)
        wm = WeightMeasures(samples=n, heads=1, seq_len=t, block=4, causal=True, device=torch.device("cpu"))
        wm.add(RowBlock(0, 0, 0, torch.as_tensor(w)))
        got = wm.result()
        mean, se = got["band_mass"][0, 0, 0], got["band_mass_se"][0, 0]
        covered += abs(mean - truth) <= 1.959963984540054 * se
    assert 0.93 <= covered / runs <= 0.97, covered / runs


def test_the_file_format_page_lists_every_dataset_of_the_table() -> None:
    """docs/hdf5.md names every row of the table of datasets, or points to the measures' table of
    docs/position-measures.md for it (a new measure is a row and a line there), whose stat-axis means have their
    ``<mean>_se`` beside them by the line that says so."""
    import re
    from pathlib import Path

    from biasviz.store.datasets import DISTANCE_BINS, ROWS, se_name

    docs = Path(__file__).parents[2] / "docs"
    page = (docs / "hdf5.md").read_text()
    assert "every other measure in the table of position-measures.md" in page and "/layer_{L}/<mean>_se" in page
    table = set(re.findall(r"^\| `([a-z_]+)` \|", (docs / "position-measures.md").read_text(), re.M))
    errors = {se_name(name) for name in table if name in ROWS and ROWS[name].dims[0] == "stat"}
    missing = [name for name in (*ROWS, DISTANCE_BINS) if name not in page and name not in table | errors]
    assert not missing, missing


def test_samples_masked_otherwise_after_samples_without_a_mask() -> None:
    """Samples 0-2 come in blocks that bring no cells (the causal triangle), samples 3-5 in blocks that bring their
    own (left padding of 0, 4 and 9 positions): each sample's measures are over its own cells, as float64 math one
    sample at a time finds them, with nothing set on the reducer between the two."""
    n, h, t, block, rows = 6, 2, 23, 5, 7
    causal = np.tril(np.ones((t, t), bool))
    masks = np.stack([causal] * n)
    for a, pad in zip((3, 4, 5), (0, 4, 9), strict=True):
        masks[a, :, :pad] = False
        masks[a, :pad] = False
    rng = np.random.default_rng(11)
    with np.errstate(invalid="ignore"):  # a padded query sees no key: all its weights 0
        w = np.nan_to_num(np.concatenate([_weights(rng, 1, h, t, masks[a][None]) for a in range(n)]))
    wm = WeightMeasures(samples=n, heads=h, seq_len=t, block=block, causal=True, device=torch.device("cpu"))
    for first, own in ((0, False), (3, True)):
        for r0 in range(0, t, rows):
            r1 = min(t, r0 + rows)
            cells = torch.as_tensor(masks[first : first + 3, None, r0:r1, :r1]) if own else None
            weights = torch.as_tensor(w[first : first + 3, :, r0:r1, :r1], dtype=torch.float32)
            wm.add(RowBlock(0, first, r0, weights, attended=cells))
    got = wm.result()
    per_sample = [_reference(w[a : a + 1], masks[a][None], block) for a in range(n)]
    for name in ("band_mass", "context_mass", "weights_entropy"):
        x = np.concatenate([ref[name] for ref in per_sample])  # NaN where a sample has no query that counts
        held = (~np.isnan(x)).sum(0)
        mean = np.nanmean(x, 0)
        dev2 = np.nansum((x - mean) ** 2, 0)
        np.testing.assert_allclose(got[name][0], mean, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(got[name][1], np.sqrt(dev2 / held), rtol=1e-4, atol=1e-6, err_msg=name)
        se = np.where(held >= 3, np.sqrt(dev2 / (held * (held - 1)).clip(min=1)), np.nan)
        np.testing.assert_allclose(got[f"{name}_se"], se, rtol=1e-4, atol=1e-6, err_msg=name)
    assert got["sink_min_queries"].shape == (n, h)  # each sample's own keys seen: its own threshold
