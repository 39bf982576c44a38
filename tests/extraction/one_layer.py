"""One SDPA attention layer over an embedding, for the summaries' tests of the cells a call attends: a subclass says
which cells (:meth:`OneLayer.keep`) and with what scale (:meth:`OneLayer.scale`), from the tokens; and what those
tests share: a summary of a module formed again and streamed, and two files compared dataset by dataset."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from tests.summaries.test_sample_cells import HEADS, VOCAB

WIDTH = 8  # per head


class OneLayer(nn.Module):
    """q, k and v of HEADS heads from one linear map of the token embeddings, attended by one SDPA call; or, as
    :attr:`written` says, by the same arithmetic written out in eager PyTorch (q.kᵀ scaled, + the float mask, softmax),
    or by ``flex_attention`` whose score_mod adds the float mask (its -inf cells masking, as a score_mod may)."""

    written = "sdpa"  # "sdpa", "eager" or "flex"

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HEADS * WIDTH)
        self.qkv = nn.Linear(HEADS * WIDTH, 3 * HEADS * WIDTH)

    def keep(self, ids: torch.Tensor) -> torch.Tensor | None:
        """The cells attended, broadcast to (B, H, T, T) (None: every key)."""
        raise NotImplementedError

    def scale(self, ids: torch.Tensor) -> float | None:
        """What q·k is multiplied by (None: SDPA's 1/sqrt(WIDTH))."""
        return None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        parts = self.qkv(self.embed(ids)).split(HEADS * WIDTH, -1)
        q, k, v = (z.view(b, t, HEADS, WIDTH).transpose(1, 2) for z in parts)
        mask, scale = self.keep(ids), self.scale(ids)
        if self.written == "sdpa":
            return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).sum()
        assert mask is not None and mask.is_floating_point(), "eager and flex calls take a float mask here"
        c = WIDTH**-0.5 if scale is None else scale
        if self.written == "eager":
            return (torch.softmax(q @ k.transpose(-1, -2) * c + mask, dim=-1) @ v).sum()
        from torch.nn.attention.flex_attention import flex_attention

        added = mask.expand(b, HEADS, t, t)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # flex's note that it runs unfused without torch.compile
            return flex_attention(q, k, v, score_mod=lambda s, n, h, i, j: s + added[n, h, i, j], scale=c).sum()


def batch_size(ids: torch.Tensor) -> list[int]:
    """A forward's record in :func:`forwards_of`: how many samples it ran."""
    return [int(ids.shape[0])]


def first_tokens(ids: torch.Tensor) -> list[int]:
    """A forward's record in :func:`forwards_of`: each of its samples' first token."""
    return ids[:, 0].tolist()


def forwards_of(model: OneLayer, seen: Callable[[torch.Tensor], list[int]]) -> list[int]:
    """What each forward of ``model`` runs on, in order, as ``seen(ids)`` records it (each forward forms its mask once:
    :meth:`OneLayer.keep` is wrapped); the list fills as the model runs."""
    got: list[int] = []
    keep = model.keep
    model.keep = lambda ids: (got.extend(seen(ids)), keep(ids))[1]  # type: ignore[method-assign]
    return got


def positions(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, 1) query and (1, T) key positions."""
    return torch.arange(t)[:, None], torch.arange(t)[None, :]


MARK = 1  # a text holding it is attended with another scale (:class:`Rescaled`)


class Rescaled(OneLayer):
    """Causal (``rule``), a window of 5 keys back for every sample (``window``), or left padding (token 0) left out
    (``padded``); scaled by 1/4 rather than 1/sqrt(8) where the text holds MARK."""

    def __init__(self, how: str = "padded") -> None:
        super().__init__()
        self.how = how

    def keep(self, ids: torch.Tensor) -> torch.Tensor:
        i, j = positions(ids.shape[1])
        if self.how == "window":
            return ((j <= i) & (i - j < 5))[None, None]
        if self.how == "padded":
            return (j <= i)[None, None] & (ids != 0)[:, None, None, :]
        return (j <= i)[None, None]

    def scale(self, ids: torch.Tensor) -> float | None:
        return 0.25 if bool((ids == MARK).any()) else None


def joined(calls: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One call of every sample at the first's scale (:class:`Rescaled`'s calls, caught one sample at a time): each
    sample's q multiplied by its scale over the first's."""
    first = float(calls[0]["scale"])
    q = np.concatenate([c["q"] * (float(c["scale"]) / first) for c in calls])
    return {"q": q, "k": np.concatenate([c["k"] for c in calls]), "scale": np.asarray(first),
            "kept": np.concatenate([c["kept"] for c in calls]), "added": np.concatenate([c["added"] for c in calls])}


def assert_as_reference(got: np.ndarray, want: np.ndarray, name: str, rtol: float = 2e-5, atol: float = 1e-5) -> None:
    """A stored dataset against float64 math: the same shape, NaN exactly where the reference has no cell, the rest
    within ``rtol`` and ``atol``."""
    assert got.shape == want.shape and np.array_equal(np.isnan(got), np.isnan(want)), name
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=name)


def summary_of(model: nn.Module, ids: torch.Tensor, out: Any, batch: int, resolution: int,
               streamed: bool, **options: Any) -> list[str]:  # fmt: skip
    """``biasviz.extract(model, ids, out, summary=True, **options)`` (``streamed``: as models biasviz cannot form again
    are), and what it said."""
    import biasviz
    import biasviz.extraction.summary as summary

    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        if streamed:
            patch.setattr(summary, "forms_rows_again", lambda adapter: False)
        biasviz.extract(model, ids.numpy(), out, summary=True, progress=False, batch_size=batch, resolution=resolution,
                        **options)  # fmt: skip
    return [str(w.message) for w in said]


def read_layer(path: Any) -> dict[str, np.ndarray]:
    """Every dataset of a summary's one layer."""
    with h5py.File(path, "r") as f:
        (layer,) = (name for name in f if name.startswith("layer_"))
        return {key: f[layer][key][()] for key in f[layer]}


def both_ways(model: nn.Module, ids: torch.Tensor, tmp: Path, batch: int, resolution: int,
              **options: Any) -> dict[str, Any]:  # fmt: skip
    """The summary as ``extract --summary`` takes it (``stored``, what it ``said``, and whether it ``went_streamed``:
    streamed from the start, or started again) and the same summary streamed from the start (``streamed``); ``options``
    go to :func:`biasviz.extract` (a ``forward``)."""
    import biasviz.extraction.summary as summary

    went = []
    with pytest.MonkeyPatch.context() as patch:
        inner = summary._streamed
        patch.setattr(summary, "_streamed", lambda *a, **k: went.append(1) or inner(*a, **k))
        said = summary_of(model, ids, tmp / "again.h5", batch, resolution, streamed=False, **options)
    summary_of(model, ids, tmp / "streamed.h5", batch, resolution, streamed=True, **options)
    return {"stored": read_layer(tmp / "again.h5"), "streamed": read_layer(tmp / "streamed.h5"), "said": said,
            "went_streamed": bool(went)}  # fmt: skip


def assert_same_datasets(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float = 1e-4,
                         atol: float = 1e-6) -> None:  # fmt: skip
    """The same datasets, each (a table's columns one by one) within ``rtol`` and ``atol``, NaN where the other's is."""
    assert got.keys() == want.keys()
    for name, values in want.items():
        for field in values.dtype.names or [None]:
            a, b = (x if field is None else x[field] for x in (got[name], values))
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"{name} {field}")
