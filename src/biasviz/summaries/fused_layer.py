"""A layer's summary from the fused kernels (:mod:`biasviz.summaries.kernels`): the same reducers' results as the rows
formed again in torch (:mod:`biasviz.summaries.replay`), from sums the kernels add up tile by tile on the GPU.

The kernels read every sample's q and k where the bank holds them and form each tile's scores and weights in registers;
nothing of size T² is written. What they return are the reducers' own sums (block maps, sums by distance and by key,
each sample's sums for the standard errors, P's), so the results are finished by the same code as the torch path's
(:class:`~biasviz.summaries.weight_measures.WeightMeasures`, :class:`~biasviz.summaries.sample_blocks.SampleBlocks`,
...).

They cover a causal call, or one whose own mask (a sliding window, packed documents the same in every sample, a traced
call's bool mask) is one for every sample and head within the causal triangle with a key in every row, and a bias the
same in every sample (or none): a function of i - j alone, of the key alone, FIRE's MLP, or one kept cell by cell. A
declared bias is measured first, every sample's bias rows formed by the model's own scheme against f(d) (FIRE's against
the first sample's), as the torch path measures it; one a forward kept was compared with every sample's there. A bias
that differs by sample as e_a(i) - e_a(j) (CABLE's, FoX's full gate) is formed in each tile from each sample's e, and
summarised by a third kernel from e alone, its per-sample sums from running sums of e. Samples that attend different
cells (padding, documents of their own) are covered too, each sample's own cells read for it: each cell's mean and
spread over the samples that attend it, everything per sample over its own cells, and no P (it pairs the cells of
different samples as one grid), as the torch path takes them; beside them, a row of keys of each sample's own (BLOOM's
beside padding) is added to each sample's scores, and the bias itself summarised in torch (:func:`~biasviz.summaries.
replay.bias_again`). A softmax over cap·tanh(s / cap) (Gemma 2) or beside sink
columns (GPT-OSS) is formed as the model forms it, the scores staying s. Any other layer takes the torch path; each
layer's ``statistics`` attribute records which ran (docs/hdf5.md, 'Summary files').
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from biasviz.adapters.again import SAMPLE_CELLS
from biasviz.common.memory import size_text
from biasviz.common.settings import statistics_mode
from biasviz.common.shapes import host_arrays, step_cells
from biasviz.store.datasets import (
    MIN_SE_SAMPLES,
    SAMPLES_PER_CELL,
    SEGMENTS,
    map_name,
    profile_name,
    reduced_rows,
)
from biasviz.store.format import non_finite_error
from biasviz.summaries import QuantitySummary, Summary
from biasviz.summaries.attended import Attended, samples_per_cell
from biasviz.summaries.fused_finish import ends_summary, positional_results
from biasviz.summaries.kernels.biases import Bias, MlpBias, SampleEnds, SampleKeys
from biasviz.summaries.maps import _group_sums, geometry_counts
from biasviz.summaries.position import PositionSummary
from biasviz.summaries.positional_blocks import JackknifeBlocks
from biasviz.summaries.positional_frequency import add_pair_sum_residual, rotary_measures
from biasviz.summaries.reducers import KernelSums, kernel_results
from biasviz.summaries.replay import bias_again
from biasviz.summaries.sample_blocks import SampleBlocks, block_errors
from biasviz.summaries.sample_cells import BY_SAMPLE_NOTE, SampleCells
from biasviz.summaries.sample_profiles import SampleProfiles, per_sample_profiles, profile_errors
from biasviz.summaries.sharing import Agreement

FUSED, TORCH = "fused", "torch"  # a summary layer's ``statistics`` attribute
CHOSEN = "BIASVIZ_STATISTICS=torch"  # why_not's answer where the user chose the torch path: nothing to warn of
CHECK_CELLS = 1 << 26  # bias cells formed and compared at a time (a GPU's step; a CPU's is smaller)
SUMS_SHARE = 4  # the kernels' sums may take at most a quarter of the device's free memory


def sums_bytes(samples: int, heads: int, seq_len: int, block: int, own_bias: bool = False) -> int:
    """Bytes of the kernels' float64 sums for one layer: per sample and head 4T + 3 nb² + 11 (rows, columns,
    distances, the block sums and P's jackknife, the tenths and the sink), per head 5 nb² + 16 T + 4 (the maps, P's,
    the sums by distance and key), and K1's float32 log-sum-exp. ``own_bias``: a bias of each sample's own, whose ends
    (twice, and their mean) and K3's sums (per head 2 nb² + 5 T + 5) come beside. Each sample's block sums grow with
    N: the torch path folds them as they come instead."""
    nb = -(-seq_len // block)
    per_sample, per_head = 4 * seq_len + 3 * nb * nb + 11, 5 * nb * nb + 16 * seq_len + 4
    if own_bias:
        per_head += 2 * nb * nb + 5 * seq_len + 5
    ends = 4 * (2 * samples + 1) * heads * seq_len if own_bias else 0
    return 8 * heads * (samples * per_sample + per_head) + 4 * samples * heads * seq_len + ends


def why_not(adapter: Any, bank: Any, layer: int, device: torch.device, *, by_sample: bool,
            mask: torch.Tensor | None, table: Bias | None, block: int) -> str | None:  # fmt: skip
    """Why the fused kernels do not summarise ``layer`` (None: they do); ``mask`` (1 or H, T, T) bool: the call's own,
    one for every sample (None: causal), or with ``by_sample`` the cells some sample attends (each sample's own are
    read from the bank: a padded query may see no key)."""
    if (absent := fused_available(device)) is not None:
        return absent
    if not adapter.fused_rows:
        return f"the kernels do not form the rows of {adapter.architecture} models yet"
    if not adapter.layer_causal(layer):
        return "it sees keys after its query (the kernels form causal rows)"
    if mask is not None and not by_sample and (why := _mask_fits(mask)) is not None:
        return why
    if by_sample and bank.cell_heads(layer, SAMPLE_CELLS) > 1:  # the kernels take one set of cells a sample
        return "its heads attend cells of their own, and each sample its own"
    if isinstance(table, SampleEnds) and (mask is not None or by_sample):
        return "its bias differs by sample beside a mask of its own"
    if isinstance(table, SampleKeys) and not by_sample:
        return "its bias of the key differs by sample, one set of cells for all"
    if adapter.adds_bias and table is None:
        return "its bias is neither a function of i - j alone nor one of the key alone, the same for every input"
    if bank.whole(layer, "q") is None or bank.whole(layer, "k") is None:
        return "its q and k spilled to a temporary file"
    seq_len = bank.seq_len(layer, "q")
    need = sums_bytes(bank.samples, adapter.n_heads, seq_len, block, own_bias=isinstance(table, SampleEnds))
    if by_sample:  # each sample's bits, tenths and tile classes on the device beside them
        need += bank.samples * seq_len * (-(-seq_len // 8) + 4 * (SEGMENTS + 1))
    if device.type == "cuda" and need * SUMS_SHARE > torch.cuda.mem_get_info(device)[0]:
        return (f"its per-sample sums would take {size_text(need)}, over a quarter of the GPU's free memory (fewer "
                "samples, or a coarser --resolution, fit)")  # fmt: skip
    return None


def fused_available(device: torch.device) -> str | None:
    """Why no layer on ``device`` takes the fused kernels in this run (None: they may): the user chose the torch path,
    the device is not a CUDA GPU (unless ``BIASVIZ_STATISTICS=fused``), or Triton is missing."""
    from biasviz.summaries import kernels

    mode = statistics_mode()
    if mode == "torch":
        return CHOSEN
    if mode == "auto" and device.type != "cuda":
        return f"the fused kernels run on a CUDA GPU, not on {device.type}"
    return kernels.unavailable(device)


def _mask_fits(mask: torch.Tensor) -> str | None:
    """Why the kernels cannot take a call's own mask (1 or H, T, T) (None: they can): three checks, one read."""
    differ, after, empty = torch.stack([(mask != mask[:1]).any(), mask[0].triu(1).any(),
                                        ~mask[0].any(-1).all()]).tolist()  # fmt: skip
    if differ:
        return "its heads attend different cells"
    if after:
        return "its mask attends keys after the query"
    if empty:
        return "a query of its mask attends no key"
    return None


def fused_layer(adapter: Any, bank: Any, layer: int, own: dict[str, QuantitySummary], *, samples: int, seq_len: int,
                block: int, device: torch.device, positional: bool, measures: bool, table: Bias | None,
                attended: Attended | None = None, cells: SampleCells | None = None,
                measured: bool = False) -> PositionSummary | None:  # fmt: skip
    """The layer's summaries (``own``'s weights and scores given their results) and its docs/positional.md extras,
    over the cells of ``attended`` (the call's own mask, one for all; None: causal; where samples are masked
    differently, ``cells``, the cells some sample attends, each sample's own read from the bank for it); None, with
    nothing given, where a sample's bias differs from ``table`` (the torch path then forms the layer). ``measured``:
    ``table`` is the bias the keeping forward kept, compared with every sample's there, exactly: not compared again."""
    from biasviz.summaries import kernels

    heads, n = adapter.n_heads, samples
    bias = own.get("bias")
    ends = table if isinstance(table, SampleEnds) else None  # a bias of each sample's own: nothing to compare
    keys = table if isinstance(table, SampleKeys) else None  # ... beside each sample's own cells
    if ends is not None:
        ends = SampleEnds(ends.ends.to(device))
    elif keys is not None:
        if bias is not None:  # summarised per sample over its own cells, no longer compared (as the torch path does)
            bias.stop_comparing()
    elif table is not None and not measured:
        agreement = _bias_agreement(adapter, bank, layer, table, samples=n, seq_len=seq_len, device=device)
        if agreement is None or agreement.largest > 0.0:
            return None
        if bias is not None and bias.agreement is not None:
            bias.agreement = agreement
    q, k = (_operands(bank, layer, name, heads if name == "q" else None, seq_len) for name in ("q", "k"))
    hd = q.shape[-1]
    k = k.view(n, seq_len, -1, hd)[:, :, :: adapter.key_repeats(layer)].transpose(1, 2)  # each key head once
    with_p = positional and n >= 2 and cells is None  # P pairs the cells of different samples: none by sample
    own_cells = None if cells is None else OwnCells(bank, layer, n, seq_len, device)
    if cells is not None and attended is not None:  # P left out, said as the torch path says it
        warnings.warn(f"attention call {layer}: {BY_SAMPLE_NOTE}", stacklevel=3)
    mask = own_cells if cells is not None else None if attended is None else attended.mask[0].to(device)
    sinks = adapter.sink_logits(layer, bank)  # a softmax beside sink columns (GPT-OSS), or softcapped (Gemma 2)
    bias_terms = table.to(device) if torch.is_tensor(table) else table  # (an MlpBias goes to the device packed)
    acc = kernels.layer_accumulators(q, k, bias_terms, adapter.score_scale(layer), block, positional=with_p,
                                     cells=mask, softcap=adapter.score_softcap(layer),
                                     sinks=None if sinks is None else sinks.to(device))  # fmt: skip
    counts = geometry_counts(seq_len, block, True, device) if attended is None else attended.block_counts(block)
    finite = torch.stack([torch.isfinite(acc[name]).all() for name in ("maps", "bias_maps") if name in acc]).tolist()
    if not all(finite):  # one read, as the torch path's
        raise non_finite_error("weights" if not finite[0] else "bias", layer)
    if ends is not None and bias is not None:  # its own summary, from K3's sums
        bias.given, bias.given_differs = ends_summary(acc, ends, samples=n, seq_len=seq_len, block=block), True
    done = kernels.finish(acc["maps"], acc["by_distance"], acc["columns"], acc["row_ws"], acc["sinks"], block,
                          table, attended, cells)  # the maps, profiles, key profile and sink shares
    shares = None if attended is None else attended.block_shares(block, heads)
    for kind in ("weights", "scores"):
        mean_map, std_map, profile = host_arrays(*(done[map_name(kind, stat)] for stat in ("mean", "std")),
                                                 done[profile_name(kind)])  # fmt: skip
        own[kind].given = Summary(mean=mean_map, std=std_map, profile=profile, diagnostics=None)
    # P's sums by distance: less a table's f(d), or (any other form, which changes along a diagonal) P's own
    unshifted = not torch.is_tensor(table)
    p_mean, p_profile, p_diagnostics = (None, None, None)
    if with_p:
        p_mean, p_profile, p_diagnostics = positional_results(acc, None if unshifted else table, layer, seq_len, counts,
                                                              attended)  # fmt: skip
    bias_pass = None
    if keys is not None and bias is not None:  # its own summary and SEs: each sample's rows over its own cells (torch)

        def bias_pass(profiles: SampleProfiles | None, blocks: SampleBlocks | None) -> None:
            bias_again(lambda a, r0, r1: keys.rows(a, r0, r1).to(device),
                       lambda a, r0, r1: bank.get_cells(layer, SAMPLE_CELLS, a, r0, r1, r1).to(device)[None], bias,
                       samples=n, seq_len=seq_len, heads=heads, device=device, profiles=profiles,
                       blocks=blocks)  # fmt: skip

    sums = KernelSums(by_distance=acc["sample_distance"][0], block=block, finished=done)
    arrays = None
    if measures:
        # a bias of each sample's own: its sums by distance (over all cells, over the first keys') and by block, once
        by_distance, own_sums = None, None
        if ends is not None:
            by_distance = ends.distance_sums()
            own_sums = (by_distance[0], ends.block_sums(block))
        arrays = _measures(acc, sums, own, samples=n, heads=heads, seq_len=seq_len, block=block,
                           device=device, attended=attended, own_cells=own_cells, bias_sums=own_sums,
                           bias_pass=bias_pass)  # fmt: skip
        arrays.update(rotary_measures(adapter, bank, layer, heads, attended, positional, own=cells is not None,
                                      bias=by_distance))  # fmt: skip
        if cells is not None and cells.samples is not None:  # how many samples attend each cell
            arrays[SAMPLES_PER_CELL] = samples_per_cell(cells.samples, cells.union, block, heads)
        if p_profile is not None and not adapter.adds_bias:
            add_pair_sum_residual(arrays, p_profile[0], attended)
    elif bias_pass is not None:
        bias_pass(None, None)
    rows = [name for name in reduced_rows() if name in done]  # docs/positional.md's the kernels finished
    p_mean_host, p_profile_host, shares_host, *held = host_arrays(p_mean, p_profile, shares,
                                                                  *(done[name] for name in rows))  # fmt: skip
    on_host = {name: torch.from_numpy(a) for name, a in zip(rows, held, strict=True)}
    reduced = kernel_results(replace(sums, finished=on_host), measures=False)
    return PositionSummary(positional_mean=p_mean_host, positional_profile=p_profile_host,
                           positional_diagnostics=p_diagnostics, reduced=reduced,
                           attended=shares_host, measures=arrays, statistics=FUSED,
                           note=None if cells is None else BY_SAMPLE_NOTE)  # fmt: skip


class OwnCells:
    """Each sample's own attended cells of a layer, (T, T) bool, unpacked from the bank one sample at a time (never all
    N at once): what the kernels and the per-sample counts read where samples are masked differently."""

    def __init__(self, bank: Any, layer: int, samples: int, seq_len: int, device: torch.device) -> None:
        self.bank, self.layer, self.samples, self.seq_len, self.device = bank, layer, samples, seq_len, device

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, a: int) -> torch.Tensor:
        cells = self.bank.get_cells(self.layer, SAMPLE_CELLS, a, 0, self.seq_len, self.seq_len)
        return cells[0].to(self.device)  # one set for all heads (:func:`why_not` leaves cells by head to torch)


def _operands(bank: Any, layer: int, name: str, heads: int | None, seq_len: int) -> torch.Tensor:
    """q (N, H, T, hd) as a view of the bank's (N, T, H·hd), or k's (N, T, F) as held."""
    whole = bank.whole(layer, name)
    if heads is None:
        return whole
    return whole.view(whole.shape[0], seq_len, heads, -1).transpose(1, 2)


def _bias_agreement(adapter: Any, bank: Any, layer: int, table: Bias, *, samples: int,
                    seq_len: int, device: torch.device) -> Agreement | None:  # fmt: skip
    """Every sample's bias rows, formed by the model's scheme, against a declared scheme's f(i - j) (an
    :class:`MlpBias`: the first sample's rows, as the torch path compares a declared bias): the largest |difference|
    over the cells j <= i, settled once (None: the adapter cannot form the bias alone, or ``table`` is of another
    form: those come from a forward that compared them already)."""
    if not isinstance(table, (torch.Tensor, MlpBias)):
        return None
    agreement = Agreement(device)
    formed = isinstance(table, MlpBias)
    f = None if formed else table.to(device)
    heads = adapter.n_heads
    step = max(1, step_cells(device, CHECK_CELLS) // max(1, heads * seq_len))
    for r0 in range(0, seq_len, step):
        r1 = min(seq_len, r0 + step)
        if f is None:
            expected = adapter.bias_again(layer, bank, 0, r0, r1)  # (1, H, rows, r1)
            if expected is None:
                return None
        else:
            d = (torch.arange(r0, r1, device=device)[:, None] - torch.arange(r1, device=device)[None, :]).clamp(min=0)
            expected = f[:, d][None]  # (1, H, rows, r1)
        for a in range(1 if formed else 0, samples):
            got = adapter.bias_again(layer, bank, a, r0, r1)
            if got is None:
                return None
            agreement.compare(expected, got.to(expected.dtype), r0)
    agreement.settle()
    return agreement


def _measures(acc: dict[str, torch.Tensor], sums: KernelSums, own: dict[str, QuantitySummary], *, samples: int,
              heads: int, seq_len: int, block: int, device: torch.device,
              attended: Attended | None = None, own_cells: OwnCells | None = None,
              bias_sums: tuple[torch.Tensor, torch.Tensor] | None = None,
              bias_pass: Callable[[Any, Any], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """docs/position-measures.md's measures and standard errors, finished by the torch path's reducers from the
    kernels' per-sample sums (``sums``; its finished ``row_entropy`` (N, H, T), each row's lse - Σ w s = -Σ w log w, 0
    in a row with no key), over the cells of ``attended`` where the call has a mask of its own, or each sample's own
    (``own_cells``, one sample's (T, T) bool at a time) where samples are masked differently: the queries and cells
    counted per sample.
    ``bias_sums``: a bias of each sample's own, its per-sample sums by distance and by block (formed from its ends);
    ``bias_pass(profiles, blocks)``: one that feeds the bias's own (BLOOM's beside padding, formed again in torch)."""
    n, t = samples, seq_len
    f64 = {"dtype": torch.float64, "device": device}
    by_sample = own_cells is not None
    shared = None if by_sample else attended
    rows = torch.ones(1, 1, t, **f64)
    cells = None if attended is None or by_sample else attended.mask[None].to(device)  # (1, 1 or H, T, T)
    profiles = per_sample_profiles(own, samples=n, heads=heads, seq_len=t, causal=True, device=device)
    scores = profiles.get("scores")
    if own_cells is not None:  # the rows of each sample that see a key, its cells by block and by distance
        block_counts, looks = [], []
        for a in range(n):  # a sample's mask at a time, read from the bank once here
            mask = own_cells[a]
            block_counts.append(Attended(mask[None]).block_counts(block))
            looks.append(mask.any(-1).double())
            if scores is not None:
                scores.count_cells(a, 1, mask[None, None])
        rows = torch.stack(looks)[:, None]  # (N, 1, T)
    elif scores is not None:
        scores.count_cells(0, n, cells)
    entropy = sums.finished["row_entropy"]
    finished = replace(sums, looks=rows, cells=cells, own_cells=own_cells,
                       measures={"context": acc["context"], "columns": acc["sample_columns"],
                                 "entropy": _group_sums(entropy, -1, 0, block)})  # fmt: skip
    # the table's statistics the kernels' sums hold (the rest: rows formed again)
    arrays: dict[str, Any] = kernel_results(finished, measures=True)
    if scores is not None:
        scores.add_distance_sums(acc["sample_distance"][1])
    if bias_sums is not None and "bias" in profiles:
        profiles["bias"].count_cells(0, n, None)
        profiles["bias"].add_distance_sums(bias_sums[0])
    sums = {}  # with blocks of one position the maps' SEs come from their spread (map_errors); P's never do
    if n >= MIN_SE_SAMPLES and block > 1:
        sums = {"weights": acc["sample_blocks"][0], "scores": acc["sample_blocks"][1]}
        if bias_sums is not None:
            sums["bias"] = bias_sums[1]
    if "jackknife_blocks" in acc:
        sums["positional"] = acc["jackknife_blocks"]
    blocks: dict[str, SampleBlocks] = {}
    for kind, values in sums.items():
        kept = JackknifeBlocks if kind == "positional" else SampleBlocks
        blocks[kind] = kept(heads=heads, seq_len=t, block=block, causal=True, device=device, attended=shared)
        blocks[kind].samples = n
        blocks[kind].begin(0, n)
        # where samples are masked differently, how many of its own cells each block holds
        blocks[kind].add_block_sums(values, None if own_cells is None else torch.stack(block_counts))
    if bias_pass is not None:
        if n >= MIN_SE_SAMPLES and block > 1:
            blocks["bias"] = SampleBlocks(heads=heads, seq_len=t, block=block, causal=True, device=device,
                                          attended=shared)  # fmt: skip
            blocks["bias"].begin(0, n)
        bias_pass(profiles.get("bias"), blocks.get("bias"))
    arrays.update({**profile_errors(profiles, own, n), **block_errors(blocks)})
    return arrays


def tell(layers: list[int], reason: str) -> None:
    """One warning for the layers of a GPU that took the torch path for one reason."""
    which = f"attention call {layers[0]}" if len(layers) == 1 else f"attention calls {', '.join(map(str, layers))}"
    warnings.warn(f"{which}: summarised by the torch path, not the fused kernels: {reason}", stacklevel=3)
