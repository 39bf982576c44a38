"""Summary files (docs/hdf5.md, 'Summary files') and shared-bias full files written directly with h5py and plain numpy.

Independent of biasviz's writer and of its own reductions: each summary quantity is computed here the
slow, obvious way (nanmean over a padded block view, per-distance loops, least squares with lstsq), so
the tests compare biasviz's readers against a second computation, not against themselves.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np

ATTRS = {"source_model": "synthetic", "model_sha256": "0" * 64, "architecture": "gpt2", "n_layers": 4, "seed": 0,
         "text_source": "synthetic", "device": "cpu", "biasviz_version": "0.1.0", "torch_version": "none",
         "created_utc": "2025-01-01T00:00:00+00:00", "biasviz_format": 1, "dtype": "float32"}  # fmt: skip


def dist(t: int) -> np.ndarray:
    pos = np.arange(t)
    return pos[:, None] - pos[None, :]


def alibi(n: int, heads: int, t: int) -> np.ndarray:
    """(sample, head, query, key): the same ALiBi bias for every sample, NaN above the diagonal."""
    slopes = 2.0 ** (-8 * np.arange(1, heads + 1) / heads)
    b = -slopes[:, None, None] * dist(t)
    return np.repeat(np.where(dist(t) >= 0, b, np.nan)[None], n, axis=0).astype(np.float32)


def cable(n: int, heads: int, t: int, seed: int = 0) -> np.ndarray:
    """A cumulative decay s_i - s_j that changes with the sample (context-dependent), NaN above the diagonal."""
    s = -np.cumsum(np.log1p(np.exp(np.random.default_rng(seed).normal(size=(n, heads, t)))), axis=-1)
    return np.where(dist(t) >= 0, s[..., :, None] - s[..., None, :], np.nan).astype(np.float32)


def weights_of(bias: np.ndarray) -> np.ndarray:
    """Softmax of the bias alone over the causal cells; 0 above the diagonal."""
    z = np.where(np.isnan(bias), -np.inf, bias).astype(np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def block_mean(cells: np.ndarray, block: int) -> np.ndarray:
    """(..., T, T) with NaN on unused cells -> (..., nb, nb): nanmean over each block (NaN for none)."""
    t = cells.shape[-1]
    nb = -(-t // block)
    padded = np.full((*cells.shape[:-2], nb * block, nb * block), np.nan)
    padded[..., :t, :t] = cells
    view = padded.reshape(*cells.shape[:-2], nb, block, nb, block)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(view, axis=(-3, -1))


def profile(x: np.ndarray) -> np.ndarray:
    """(sample, head, T, T) -> (2, head, T): mean and population std over samples and cells with i - j = d."""
    n, heads, t, _ = x.shape
    out = np.zeros((2, heads, t))
    for h in range(heads):
        for d in range(t):
            vals = np.concatenate([np.diagonal(x[s, h], -d) for s in range(n)]).astype(np.float64)
            out[0, h, d], out[1, h, d] = vals.mean(), vals.std()
    return out


def diagnostics(bias: np.ndarray) -> np.ndarray:
    """(head,) records of docs/diagnostics.md, by their definitions (lstsq for the separable fit)."""
    n, heads, t, _ = bias.shape
    cells = dist(t) >= 0
    i, j = np.nonzero(cells)
    rec = np.zeros(heads, dtype=[("context_dependence", "f8"), ("toeplitz_residual", "f8"),
                                 ("separability_residual", "f8")])  # fmt: skip
    for h in range(heads):
        b = bias[:, h].astype(np.float64)
        mean = b.mean(0)[cells]
        spread = mean.std()
        rec["context_dependence"][h] = b.std(0)[cells].mean() / spread if n >= 2 else np.nan
        d = (i - j)
        diag_mean = np.array([mean[d == k].mean() for k in range(t)])
        rec["toeplitz_residual"][h] = np.sqrt(np.mean((mean - diag_mean[d]) ** 2)) / spread
        a = np.zeros((i.size, t))
        a[np.arange(i.size), i] += 1
        a[np.arange(i.size), j] -= 1
        s = np.linalg.lstsq(a, mean, rcond=None)[0]
        rec["separability_residual"][h] = np.sqrt(np.mean((mean - a @ s) ** 2)) / spread
    return rec


def _label(ds: h5py.Dataset, labels: tuple[str, ...]) -> None:
    for k, label in enumerate(labels):
        ds.dims[k].label = label


def write_summary(path: Path, scheme: str = "cable", *, bias: np.ndarray | None = None,
                  weights: np.ndarray | None = None, resolution: int = 1024, layer: int = 3,
                  bias_only: bool = False, steps: list[int] | None = None,
                  attrs: dict[str, object] | None = None) -> Path:  # fmt: skip
    """A summary file of (sample, head, query, key) ``bias`` and ``weights`` (None: absent); with ``steps``,
    a sweep whose every checkpoint holds the same data."""
    ref = bias if bias is not None else weights
    assert ref is not None
    n, heads, t, _ = ref.shape
    block = max(1, -(-t // resolution))
    starts = np.arange(0, t, block, dtype=np.int64)
    lead = () if steps is None else (len(steps),)
    mask = dist(t) >= 0
    with h5py.File(path, "w") as f:
        f.attrs.update({**ATTRS, "scheme": scheme, "context_dependent": scheme == "cable", "n_heads": heads,
                        "seq_len": t, "layers": np.array([layer]), "samples": 0 if bias_only else n,
                        "summary": True, "resolution": resolution, "block": block, **(attrs or {})})  # fmt: skip
        if bias_only:
            f.attrs["bias_only"] = True
        f.create_dataset("input_ids", data=np.zeros((0 if bias_only else n, t), np.int32))
        for name in ("query_block", "key_block"):
            f.create_dataset(name, data=starts).make_scale(name)
        if steps is not None:
            f.create_dataset("checkpoint", data=np.array(steps, np.int64)).make_scale("checkpoint")
        g = f.create_group(f"layer_{layer}")

        def put(name: str, data: np.ndarray, dims: tuple[str, ...]) -> None:
            full = np.broadcast_to(data, (*lead, *data.shape)) if lead else data
            ds = g.create_dataset(name, data=full)
            _label(ds, ("checkpoint", *dims) if lead else dims)
            if lead:
                ds.dims[0].attach_scale(f["checkpoint"])
            if dims[-1] == "key_block":
                ds.dims[len(lead) + 1].attach_scale(f["query_block"])
                ds.dims[len(lead) + 2].attach_scale(f["key_block"])

        for kind, x in (("bias", bias), ("weights", None if bias_only else weights)):
            if x is None:
                continue
            cells = np.where(mask, x.astype(np.float64), np.nan)
            maps = ("head", "query_block", "key_block")
            put(f"{kind}_mean", block_mean(cells.mean(0), block).astype(np.float32), maps)
            put(f"{kind}_std", block_mean(cells.std(0), block).astype(np.float32), maps)
            put(f"{kind}_profile", profile(x).astype(np.float32), ("stat", "head", "distance"))
        if bias is not None:
            put("diagnostics", diagnostics(bias), ("head",))
    return path


def write_full(path: Path, scheme: str, bias: np.ndarray | None, weights: np.ndarray, *, shared: bool = False,
               layer: int = 3) -> Path:  # fmt: skip
    """A full format-1 file; with ``shared``, ``bias`` (1, head, query, key) stands for every sample."""
    n, heads, t, _ = weights.shape
    with h5py.File(path, "w") as f:
        f.attrs.update({**ATTRS, "scheme": scheme, "context_dependent": scheme == "cable", "n_heads": heads,
                        "seq_len": t, "layers": np.array([layer]), "samples": n})  # fmt: skip
        if shared:
            f.attrs["bias_shared"] = True
        f.create_dataset("input_ids", data=np.zeros((n, t), np.int32))
        g = f.create_group(f"layer_{layer}")
        chunks = (1, 1, t, t)
        for kind, x in (("bias", bias), ("weights", weights)):
            if x is not None:
                _label(g.create_dataset(kind, data=x, chunks=chunks, compression="gzip"),
                       ("sample", "head", "query", "key"))  # fmt: skip
    return path
