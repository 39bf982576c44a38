"""The fused statistics path: a layer's summary reduced inside two Triton kernels from q, k and a bias of distance,
on a GPU (or on the CPU under Triton's interpreter, where the tests prove it).

Beside the scores, a softmax may take a softcap (Gemma 2's cap·tanh(s / cap)) and sink columns (GPT-OSS's: each row's
sink logit, (N, T, H) as the bank holds it, in the denominator beside the keys): the ``softcap`` and ``sinks`` of
:func:`row_lse`, :func:`accumulate` and :func:`layer_accumulators`. The scores stay s, before the cap.

Triton is an optional extra (``pip install 'biasviz[gpu]'``); it is imported only when :func:`fused_statistics` runs.
:func:`unavailable` says why the fused path cannot run, for the caller to take the torch path and say so.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from biasviz.store.datasets import KEY_PROFILE, SINK_SHARE, map_name, profile_name
from biasviz.summaries.kernels.biases import Bias, CellBias, KeyBias, MlpBias, SampleEnds, SampleKeys
from biasviz.summaries.kernels.masks import mask_operands, sample_operands  # noqa: F401  (what the kernels read)
from biasviz.summaries.maps import _group_sums, geometry_counts

TILE = 32  # query and key tile (rows and columns per program step); a power of 2, at least 16 for tl.dot


def interpreted() -> bool:
    """Whether Triton runs its kernels through its interpreter (``TRITON_INTERPRET=1``): any device, slowly."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


# per device, why Triton refused the kernels there earlier in this process: the same GPU refuses them again
_REFUSED: dict[str, str] = {}


def unavailable(device: torch.device) -> str | None:
    """Why the fused kernels cannot run on ``device`` (None: they can)."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (pip install 'biasviz[gpu]')"
    if device.type != "cuda" and not interpreted():
        return f"the fused kernels run on a CUDA GPU, not on {device.type}"
    return _REFUSED.get(_key(device))


def _key(device: torch.device) -> str:
    """``device`` with its index (``cuda`` and ``cuda:0`` are one GPU where the current one is 0)."""
    index = device.index
    if index is None and device.type == "cuda":
        index = torch.cuda.current_device()
    return f"{device.type}:{index or 0}"


def refused(device: torch.device, exc: BaseException) -> str | None:
    """Why the kernels cannot run on ``device`` where ``exc`` is Triton refusing to build or launch them there (shared
    memory or registers past what the GPU has, its compiler or assembler failing for the GPU, a launch the driver
    refused): recorded, so that the run's later layers take the torch path at once; None for any other error (a bug,
    memory that ran out, an error of Triton's interpreter, which the tests must see), which the caller raises."""
    from biasviz.common.out_of_memory import ran_out

    name = type(exc).__name__
    triton_own = type(exc).__module__.split(".")[0] == "triton" and name != "InterpreterError"
    if not (triton_own or (isinstance(exc, RuntimeError) and "Triton Error" in str(exc))) or ran_out(exc) is not None:
        return None
    first = (str(exc).strip().splitlines() or [""])[0]
    first = first.split(". ")[0].rstrip(".")[:200]  # what failed, not Triton's advice to the kernels' author
    why = _REFUSED[_key(device)] = f"Triton could not build or launch them for this GPU ({name}: {first})"
    return why


def fused_statistics(q: torch.Tensor, k: torch.Tensor, table: Bias | None, scale: float, block: int,
                     tile: int = TILE, softcap: float | None = None,
                     sinks: torch.Tensor | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """A causal layer's statistics over N samples, its scores s = c q k^T + f(i - j) and weights softmax(s) formed in
    tiles and never stored.

    ``q`` (N, H, T, hd), ``k`` (N, H_kv, T, hd) with H a multiple of H_kv (grouped queries), ``table`` (H, T) the
    bias f_h(d) for d = 0 .. T - 1 (None: no bias), maps of ``block`` x ``block`` positions. Returns, on q's device:

    - ``weights_mean``, ``weights_std``, ``scores_mean``, ``scores_std``: (H, nb, nb) float32 block means of each
      cell's mean and population spread over samples, NaN where a block has no cell j <= i;
    - ``weights_profile``, ``scores_profile``: (2, H, T) float32, mean and spread by distance d = i - j;
    - ``weights_key_profile``: (2, H, T) float32, mean and spread by key over the queries that see it;
    - ``sink_share``: (N, H) float32, each sample's mean weight on key 0;
    - ``row_entropy``: (N, H, T) float64, each sample's entropy of each row's weights, -Σ w log w.

    ``softcap``, ``sinks``: what the softmax takes beside the scores (the module's docstring).
    """
    n, heads, seq_len, hd = q.shape
    if heads % k.shape[1] or k.shape[0] != n or k.shape[2] != seq_len or k.shape[3] != hd:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} do not pair")
    lse = row_lse(q, k, table, scale, tile, softcap=softcap, sinks=sinks)
    return finish(*tile_sums(q, k, table, lse, scale, block, tile, softcap), block, table)


def _launch(q: torch.Tensor, k: torch.Tensor, table: Bias | None, tile: int,
            cells: torch.Tensor | None = None, softcap: float | None = None) -> dict:  # fmt: skip
    """What both kernels take: the bias as float32 (a placeholder without one; a table of distance or a
    :class:`KeyBias`' row of keys as held), strides, sizes and tiles, the mask's bits, tile classes and tenths
    (:func:`mask_operands`; placeholders without one), and the softcap (1.0 where there is none: not read). An
    :class:`MlpBias` goes in packed, its hidden units (``hid``) a compile-time constant; a :class:`CellBias` as
    held, one table for every head (kind 4) or one a head (5)."""
    n, heads, seq_len, hd = q.shape
    bias, kind = q.new_empty(1), 0
    if isinstance(table, MlpBias):
        bias, kind = table.packed(q.device), 3
    elif isinstance(table, CellBias):
        bias, kind = table.packed(q.device), 4 if table.values.shape[0] == 1 else 5
    elif isinstance(table, (SampleEnds, SampleKeys)):
        own = table.ends if isinstance(table, SampleEnds) else table.values
        if own.shape != (n, heads, seq_len):
            raise ValueError(f"each sample's bias terms {tuple(own.shape)} are not (N, H, T) = {(n, heads, seq_len)}")
        bias, kind = table.packed(q.device), 6 if isinstance(table, SampleEnds) else 7
    elif isinstance(table, KeyBias):
        bias, kind = table.packed(q.device), 2
    elif table is not None:
        bias, kind = table.to(device=q.device, dtype=torch.float32).contiguous(), 1
    tiles = -(-seq_len // tile)
    masked = {"cells": q.new_empty(1, dtype=torch.uint8), "classes": q.new_empty(1, dtype=torch.int8),
              "bounds": q.new_empty(1, dtype=torch.int32), "width": 1}  # fmt: skip
    by_sample = cells is not None and (isinstance(cells, dict) or not torch.is_tensor(cells) or cells.dim() == 3)
    if by_sample:  # :func:`sample_operands`', formed once for both kernels
        masked = {name: value.to(q.device) if torch.is_tensor(value) else value
                  for name, value in (cells if isinstance(cells, dict) else sample_operands(cells, tile)).items()}
    elif cells is not None:
        masked = mask_operands(cells.to(q.device), tile)
    return {"bias": bias, "strides": (*q.stride(), *k.stride()), "group": heads // k.shape[1],
            "dp": max(16, 1 << (hd - 1).bit_length()),  # head dims padded to a power of 2 (masked)
            "tiles": tiles, "has_bias": kind, **masked, "masked": cells is not None,
            "by_sample": by_sample, "cap": 1.0 if softcap is None else float(softcap),
            "softcap": softcap is not None, "hid": table.w1.numel() if isinstance(table, MlpBias) else 1}  # fmt: skip


def _sub_blocks(block: int, tile: int) -> int:
    """How a tile meets the map's blocks (the kernel's ``SUB``): ``tile`` where a block holds whole tiles, ``block``
    where blocks split a tile evenly, 0 where they do not (each cell added to its block).

    >>> _sub_blocks(64, 32), _sub_blocks(4, 32), _sub_blocks(12, 32)
    (32, 4, 0)
    """
    if block % tile == 0:
        return tile
    return block if tile % block == 0 else 0


def row_lse(q: torch.Tensor, k: torch.Tensor, table: Bias | None, scale: float, tile: int = TILE,
            cells: torch.Tensor | None = None, softcap: float | None = None,
            sinks: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """K1: (N, H, T) float32, each sample's row log-sum-exp of its causal scores (or over ``cells``, (T, T) bool, or
    (N, T, T) each sample's own; 0 for a row with no key and no sink); ``softcap``: of cap·tanh(s / cap); ``sinks``
    (N, T, H): each row's sink logit beside its keys."""
    from biasviz.summaries.kernels import triton_kernels as kernels

    n, heads, seq_len, hd = q.shape
    go = _launch(q, k, table, tile, cells, softcap)
    if sinks is not None and sinks.shape != (n, seq_len, heads):
        raise ValueError(f"sink logits {tuple(sinks.shape)} are not (N, T, H) = {(n, seq_len, heads)}")
    sink = q.new_empty(1) if sinks is None else sinks.to(device=q.device, dtype=torch.float32)
    lse = torch.empty(n, heads, seq_len, dtype=torch.float32, device=q.device)
    kernels.row_lse[(go["tiles"], n * heads)](q, k, go["bias"], lse, go["cells"], go["classes"], sink, *go["strides"],
                                              *(sink.stride() if sinks is not None else (0, 0, 0)), seq_len, heads,
                                              go["group"], hd, float(scale), go["cap"], go["width"], go["tiles"],
                                              DP=go["dp"], BM=tile, BN=tile, HAS_BIAS=go["has_bias"],
                                              MASKED=go["masked"], BY_SAMPLE=go["by_sample"], SOFTCAP=go["softcap"],
                                              HAS_SINKS=sinks is not None, HID=go["hid"])  # fmt: skip
    return lse


def tile_sums(q: torch.Tensor, k: torch.Tensor, table: Bias | None, lse: torch.Tensor, scale: float,
              block: int, tile: int = TILE, softcap: float | None = None) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """K2: the float64 accumulators (maps, sums by distance, column sums, each row's Σ w log w, sinks) of
    :func:`finish`, from q, k, the bias and K1's ``lse`` (which holds any sink columns)."""
    got = accumulate(q, k, table, lse, scale, block, positional=False, tile=tile, softcap=softcap)
    return got["maps"], got["by_distance"], got["columns"], got["row_ws"], got["sinks"]


def layer_accumulators(q: torch.Tensor, k: torch.Tensor, table: Bias | None, scale: float, block: int,
                       positional: bool = True, tile: int = TILE, cells: torch.Tensor | None = None,
                       softcap: float | None = None,
                       sinks: torch.Tensor | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """K1 then K2: every accumulator of a causal layer over its N samples, by name, float64 on q's device, as
    ``tests/summaries/fused_reference.py`` defines them, and ``lse`` (N, H, T) float32.

    ``q`` (N, H, T, hd), ``k`` (N, H_kv, T, hd), ``table`` the bias (None: none), maps of ``block`` x ``block``
    positions. Per head: ``maps``, ``by_distance``, ``columns``; per sample: ``row_ws``, ``sinks``,
    ``sample_columns``, ``context``, ``sample_distance``, ``sample_blocks``; with ``positional`` and N >= 2 the
    positional logits' ``positional_maps``, ``positional_distance``, ``positional_first``, ``positional_rows``,
    ``positional_cols``, ``positional_squares``, ``positional_shifted``, and with N >= 3 ``jackknife_blocks``.
    ``cells``: (T, T) bool, one mask for every sample within the causal triangle, or (N, T, T) each sample's own
    (no P then: it pairs the cells of different samples; a row may see no key) (None: causal). ``table``: any
    :data:`~biasviz.summaries.kernels.biases.Bias`; the sums by distance of the scores and of P hold every form but a
    table of distance unshifted (a row of keys, FIRE's MLP, cells and each sample's ends change along a diagonal); each
    sample's ends add K3's sums (:func:`ends_sums`).
    ``softcap`` (Gemma 2's cap) and ``sinks`` ((N, T, H) each row's sink logit, GPT-OSS's): what the softmax takes
    beside the scores, which stay s, before the cap."""
    n, heads, seq_len, hd = q.shape
    if heads % k.shape[1] or k.shape[0] != n or k.shape[2] != seq_len or k.shape[3] != hd:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} do not pair")
    if cells is not None and (not torch.is_tensor(cells) or cells.dim() == 3):  # each sample's own: classed once
        cells = sample_operands(cells, tile)
    lse = row_lse(q, k, table, scale, tile, cells, softcap, sinks)
    return {**accumulate(q, k, table, lse, scale, block, positional, tile, cells, softcap), "lse": lse}


def _positional_inputs(q: torch.Tensor, k: torch.Tensor, table: Bias | None,
                       scale: float) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """Q = Σ_a q_a (H, T, hd) and K = Σ_a k_a (H_kv, T, hd), summed in float64, float32 contiguous; ref (H,) float32,
    each head's positional logit P(0, 0) = c Q(0)·K(0) / (N(N - 1)) - c mean_a q_a(0)·k_a(0) / (N - 1) + b(0, 0)
    (``table``'s first value, f(0) or g(0), or the MLP's b(0, 0))."""
    n, heads = q.shape[:2]
    big_q = torch.sum(q, 0, dtype=torch.float64)
    big_k = torch.sum(k, 0, dtype=torch.float64)
    group = heads // k.shape[1]
    q0, k0 = q[:, :, 0].double(), k[:, :, 0].double().repeat_interleave(group, 1)  # (N, H, hd)
    ref = scale * (big_q[:, 0] * big_k[:, 0].repeat_interleave(group, 0)).sum(-1) / (n * (n - 1))
    ref = ref - scale * (q0 * k0).sum(-1).mean(0) / (n - 1)
    if torch.is_tensor(table):  # f(0) of a table of distance
        ref = ref + table[:, 0].to(device=q.device, dtype=torch.float64)
    elif table is not None:  # any other form says its b(0, 0)
        ref = ref + table.first().to(q.device)
    return big_q.float().contiguous(), big_k.float().contiguous(), ref.float()


def accumulate(q: torch.Tensor, k: torch.Tensor, table: Bias | None, lse: torch.Tensor, scale: float,
               block: int, positional: bool = True, tile: int = TILE, cells: torch.Tensor | None = None,
               softcap: float | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """K2: every accumulator of :func:`layer_accumulators` (but ``lse``) from q, k, the bias and K1's ``lse`` (which
    holds any sink columns: K2 reads none)."""
    from biasviz.summaries.kernels import triton_kernels as kernels

    n, heads, seq_len, hd = q.shape
    go = _launch(q, k, table, tile, cells, softcap)
    f64 = {"dtype": torch.float64, "device": q.device}
    nb = -(-seq_len // block)
    out = {
        "maps": torch.zeros(len(kernels.MAP_STATS), heads, nb, nb, **f64),
        "by_distance": torch.zeros(len(kernels.DISTANCE_STATS), heads, seq_len, **f64),
        "columns": torch.zeros(2, heads, seq_len, **f64),
        "row_ws": torch.zeros(n, heads, seq_len, **f64),
        "sinks": torch.zeros(n, heads, **f64),
        "sample_columns": torch.zeros(n, heads, seq_len, **f64),
        "context": torch.zeros(n, heads, kernels.SEGMENTS.value, **f64),
        "sample_distance": torch.zeros(2, n, heads, seq_len, **f64),
        "sample_blocks": torch.zeros(2, n, heads, nb, nb, **f64),
    }
    positional = positional and n >= 2 and not go["by_sample"]  # P pairs the cells of different samples: left out
    shapes = {"positional_maps": (heads, nb, nb), "positional_distance": (2, heads, seq_len),
              "positional_first": (heads, seq_len, 4), "positional_rows": (heads, seq_len),
              "positional_cols": (heads, seq_len), "positional_squares": (2, heads),
              "positional_shifted": (2, heads)}  # fmt: skip
    if positional:
        out.update({name: torch.zeros(shape, **f64) for name, shape in shapes.items()})
    unused = q.new_empty(1, dtype=torch.float64)
    big_q, big_k, ref = _positional_inputs(q, k, table, scale) if positional else (q.new_empty(1),) * 3
    per_sample = list(out.values())[:9]  # maps .. sample_blocks, in the kernel's order
    kernels.tile_statistics[(go["tiles"], heads)](q, k, go["bias"], lse, *per_sample, big_q, big_k, ref,
                                                  *(out.get(name, unused) for name in shapes), go["cells"],
                                                  go["classes"], go["bounds"], *go["strides"], n, seq_len, heads,
                                                  go["group"], hd, float(scale), go["cap"], block, nb, go["width"],
                                                  go["tiles"], DP=go["dp"], BM=tile, BN=tile,
                                                  HAS_BIAS=go["has_bias"], SUB=_sub_blocks(block, tile),
                                                  POSITIONAL=positional, MASKED=go["masked"],
                                                  BY_SAMPLE=go["by_sample"], SOFTCAP=go["softcap"],
                                                  HID=go["hid"])  # fmt: skip
    if positional and n >= 3:
        out["jackknife_blocks"] = jackknife_blocks(q, k, out["sample_blocks"][1], scale, block, cells)
        if isinstance(table, SampleEnds):  # z_a's - N b_a / ((N - 1)(N - 2)): each sample's own bias
            out["jackknife_blocks"] -= table.block_sums(block).to(q.device) * (n / ((n - 1) * (n - 2)))
    if isinstance(table, SampleEnds):  # the bias's own summary (K3)
        out.update(ends_sums(SampleEnds(table.ends.to(q.device)), block, tile))
    return out


def ends_sums(ends: SampleEnds, block: int, tile: int = TILE) -> dict[str, torch.Tensor]:
    """K3: the accumulators of a bias of each sample's own, e_a(i) - e_a(j) (:mod:`~biasviz.summaries.kernels.
    triton_ends`), by name, float64 on the ends' device, over the causal cells: ``bias_maps`` (2, H, nb, nb) Σ of each
    cell's mean and spread over samples by block; ``bias_distance`` (3, H, T) Σ by distance of the mean less its
    diagonal's first cell, of its square and of the variance; ``bias_rows``, ``bias_cols`` (H, T) the mean's sums
    below the diagonal by row and by column; ``bias_squares`` (2, H) Σ of its square below and on the diagonal;
    ``bias_shifted`` (2, H) Σ of the mean and of its square; ``bias_spread`` (H,) Σ of the spread."""
    from biasviz.summaries.kernels import triton_ends

    n, heads, seq_len = ends.ends.shape
    device = ends.ends.device
    e = ends.ends.double()
    centred = (e - e.mean(0, keepdim=True)).float().contiguous()  # the samples' differences from their mean
    nb = -(-seq_len // block)
    f64 = {"dtype": torch.float64, "device": device}
    shapes = {"bias_maps": (2, heads, nb, nb), "bias_distance": (3, heads, seq_len), "bias_rows": (heads, seq_len),
              "bias_cols": (heads, seq_len), "bias_squares": (2, heads), "bias_shifted": (2, heads),
              "bias_spread": (heads,)}  # fmt: skip
    out = {name: torch.zeros(shape, **f64) for name, shape in shapes.items()}
    triton_ends.ends_statistics[(-(-seq_len // tile), heads)](ends.packed(device), centred, *out.values(), n, seq_len,
                                                             heads, block, nb, BM=tile,
                                                             SUB=_sub_blocks(block, tile))  # fmt: skip
    return out


def jackknife_blocks(q: torch.Tensor, k: torch.Tensor, score_blocks: torch.Tensor, scale: float, block: int,
                     cells: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """(N, H, nb, nb) float64: Σ over a block's causal cells of z_a = [2 s_a - c(q_a·K + Q·k_a)] / ((N - 1)(N - 2)),
    from ``score_blocks`` (N, H, nb, nb) the block sums of s_a, with no cell formed: the cross terms are bilinear, so
    below the diagonal (every cell used) a block's sum is the product of its rows' and its keys' sums, and on it each
    row meets the running sum of its block's keys up to its own. O(N H T hd), one head at a time, in float64. With a
    mask (``cells``) see :func:`_masked_cross`."""
    if cells is not None:
        return (2 * score_blocks - scale * _masked_cross(q, k, cells, block)) / ((q.shape[0] - 1) * (q.shape[0] - 2))
    n, heads, seq_len, hd = q.shape
    group = heads // k.shape[1]
    nb = -(-seq_len // block)
    pad = (0, 0, 0, nb * block - seq_len)  # rows past T: 0
    below = torch.ones(nb, nb, dtype=torch.bool, device=q.device).tril(-1)
    cross = torch.zeros(n, heads, nb, nb, dtype=torch.float64, device=q.device)
    for h in range(heads):
        qa = torch.nn.functional.pad(q[:, h].double(), pad).view(n, nb, block, hd)
        ka = torch.nn.functional.pad(k[:, h // group].double(), pad).view(n, nb, block, hd)
        big_q, big_k = qa.sum(0), ka.sum(0)  # (nb, block, hd)
        off = torch.einsum("nad,bd->nab", qa.sum(2), big_k.sum(1)) + torch.einsum("ad,nbd->nab", big_q.sum(1),
                                                                                  ka.sum(2))  # fmt: skip
        on = (qa * big_k.cumsum(1)).sum((2, 3)) + (big_q * ka.cumsum(2)).sum((2, 3))  # (N, nb)
        cross[:, h] = torch.where(below, off, 0.0) + torch.diag_embed(on)
    return (2 * score_blocks - scale * cross) / ((n - 1) * (n - 2))


def _masked_cross(q: torch.Tensor, k: torch.Tensor, cells: torch.Tensor, block: int) -> torch.Tensor:
    """(N, H, nb, nb) float64: Σ over a block's attended cells of q_a(i)·K(j) + Q(i)·k_a(j), a block of keys at a time:
    each row's attended keys of the block summed first (M_b K_b, (T, hd)), then met by every sample's row. O(N H T hd
    nb + H T² hd)."""
    n, heads, seq_len, hd = q.shape
    group = heads // k.shape[1]
    nb = -(-seq_len // block)
    cells = cells.to(q.device)
    cross = torch.zeros(n, heads, nb, nb, dtype=torch.float64, device=q.device)
    for h in range(heads):
        qa, ka = q[:, h].double(), k[:, h // group].double()  # (N, T, hd)
        big_q, big_k = qa.sum(0), ka.sum(0)
        for b in range(nb):
            keys = slice(b * block, (b + 1) * block)
            m = cells[:, keys].double()  # (T, block)
            rows_k = m @ big_k[keys]  # (T, hd): each row's attended keys of block b, summed
            part = (qa * rows_k).sum(-1) + (m @ ka[:, keys]).mul(big_q).sum(-1)  # (N, T)
            cross[:, h, :, b] = _group_sums(part, -1, 0, block)
    return cross


def finish(maps: torch.Tensor, by_distance: torch.Tensor, columns: torch.Tensor, row_ws: torch.Tensor,
           sinks: torch.Tensor, block: int, table: Bias | None = None,
           attended: Any = None, cells: Any = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """The host's finish: the accumulators divided by their cells (the geometry's counts, or those of ``attended``'s
    one mask: an :class:`~biasviz.summaries.attended.Attended`), square roots, NaN where no cell; the scores' sums by
    distance, less a table of distance, get its f(d) back (the sums hold any other form of ``table`` already).
    ``cells``: samples masked differently (a :class:`~biasviz.summaries.sample_cells.SampleCells`; ``attended`` the
    cells some sample attends): the key profile over the queries that see each key averaged over samples, each
    sample's sink share over its own."""
    heads, seq_len = by_distance.shape[1:]
    counts = geometry_counts(seq_len, block, True, maps.device)  # (nb, nb)
    per_d = torch.arange(seq_len, 0, -1, dtype=torch.float64, device=maps.device)  # T - d cells at distance d
    per_key, seeing = per_d, seq_len  # T - j queries see key j; every query key 0
    if attended is not None:
        counts, per_d = attended.block_counts(block).to(maps.device), attended.per_distance.to(maps.device)
        per_key = attended.per_key.to(maps.device)
        seeing = per_key[:, 0]  # (1 or H): head h's queries that see key 0, for every sample alike
    if cells is not None:
        per_key, seeing = cells.key_queries.to(maps.device), cells.seeing.to(maps.device)
    means = torch.where(counts > 0, maps / counts, float("nan")).float()
    names = [map_name(kind, stat) for kind in ("weights", "scores") for stat in ("mean", "std")]
    out = dict(zip(names, means.unbind(0), strict=True))
    for name, (total, squares, spread) in (("weights", by_distance[:3]), ("scores", by_distance[3:])):
        mean = total / per_d
        between = (squares / per_d - mean * mean).clamp(min=0.0)
        if name == "scores" and torch.is_tensor(table):  # a table of distance (no other form is taken off)
            mean = mean + table.to(mean)
        out[profile_name(name)] = torch.stack([mean, (spread / per_d + between).sqrt()]).float()
    mean = columns[0] / per_key
    out[KEY_PROFILE] = torch.stack([mean, (columns[1] / per_key - mean * mean).clamp(min=0.0).sqrt()]).float()
    out[SINK_SHARE] = (sinks / seeing).float()
    out["row_entropy"] = -row_ws  # -Σ w log w, 0 in a row with no key
    return out
