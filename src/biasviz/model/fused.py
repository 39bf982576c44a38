"""Attention with a positional bias at the speed of a fused kernel, without any (H, T, T) tensor or bias block.

SDPA takes a bias only as a mask tensor. Written out, every block of query rows needs its (H, rows, keys) bias
copied and read back (2.1-2.8x the causal kernel at T = 4096-8192 on the CPU, BENCHMARKS section 13). Two ways
around it, chosen with every other route by :func:`biasviz.model.routes.choose` (:func:`route` asks it too):

- A bias of i - j alone (ALiBi, KERPLE, T5, FoX with a context-free gate) is a Toeplitz matrix: with the rows of a
  block reversed it is an overlapping strided view of the scheme's table of 2T - 1 distances, and SDPA's CPU
  kernel reads a mask through its strides (:func:`attend_by_table`). No compilation, any length. Distances whose
  weights underflow for the layer's q and k go in as -inf (:func:`negligible`): no subnormal weight reaches the
  kernel (on Intel cores every one takes a slow path: ALiBi ran at 1.8-2.0x the causal kernel), and heads whose far
  keys weigh nothing skip them (0.87x the causal kernel at T = 8192 for ALiBi). The default on the CPU.
- FlexAttention compiles the bias into the kernel (:func:`attend`): the scheme hands over a small tensor
  (:class:`~biasviz.schemes.base.ScoreTerms`: the distance table, or one value per position for s_i - s_j), the
  kernel reads it per cell, and a causal block mask skips the blocks past the diagonal. Used for CABLE and FoX's
  full gate, and for every such bias on a GPU, when torch's compiler works on this machine (probed by the first
  real call; a missing C++ compiler falls back to the blocked SDPA path) and the length is worth a compilation
  (:data:`MIN_LEN`).

Both serve forwards without autograd (extraction, summaries, evaluation) where nobody listens to the layer's
bias, scores or weights. Training on a GPU takes flex too, its backward compiled with it
(:mod:`biasviz.model.flex_grad`); :func:`route` chooses for both, and :func:`took` counts what each call took, for
the run's record.
"""

from __future__ import annotations

import collections
import functools
import threading
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from biasviz.common.settings import ATTENTION_MODES
from biasviz.model import routes
from biasviz.schemes.base import ScoreTerms

MIN_LEN = 2048  # below it one compilation (5-10 s on 2 cores) costs more than the kernel saves
BLOCK = 128  # FlexAttention's block of queries and keys on a GPU: the block mask's granularity
# On the CPU the blocks are also the kernel's tiles; at T = 8192 (2 cores) 128 x 128 took 1.15 s, 256 x 256 1.17,
# 256 x 512 (SDPA's own CPU split) 1.20, 512 x 512 1.19: flex's default is kept
Q_BLOCK, KV_BLOCK = 128, 128
MODES = ATTENTION_MODES
# What :func:`took` records, one name per kind of attention call
ROUTES = {
    "causal": "no bias: SDPA's causal kernel (flash on a GPU)",
    "table": "the bias as a strided view of its distance table, through SDPA (attend_by_table)",
    "flex": "the bias compiled into FlexAttention (a forward; or, training, its forward and backward)",
    "blocked": "blocks of query rows through SDPA, the bias as a mask",
    "eager": "blocks of query rows formed as weights, for a hook that listens",
    "blocked-grad": "training: blocks of rows recomputed in the backward (FlashAttention-2's scheme), in Python",
    "dense": "training: every (query, key) cell at once, as GPT-2 does (dropout on the weights, a hook listening)",
}
# Query rows per SDPA call of the strided-table path: each call computes its last rows x rows / 2 cells past the
# diagonal for nothing (rows / T of the work); fewer rows are more calls. At T = 8192 on 2 cores 512 rows took
# 1.18-1.36x the causal kernel, 768-1024 1.03-1.12x, 1536-2048 1.17-1.23x.
TABLE_ROWS = 1024
UNDERFLOW = -90.0  # exp(-90) = 8e-40: a weight under float32's smallest normal number (1.2e-38), see negligible
_probe_lock = threading.Lock()
_probe: dict[str, str | None] = {}  # device type -> None (works) or the reason it does not
_shapes: set[tuple] = set()  # the kernels compiled so far: each new shape is a compilation of its own


def mode() -> str:
    """``BIASVIZ_ATTENTION``: ``auto`` (default: on the CPU the strided table for distance biases, flex elsewhere
    where it works and pays), ``flex`` (flex wherever it works, any length), ``table`` (the strided table wherever
    the bias has one, on any device; other biases take the blocked path) or ``sdpa`` (neither: the blocked SDPA path
    without autograd and every cell at once with it, the paths before the fused ones, for comparison)."""
    from biasviz.common.settings import attention_mode

    return attention_mode()


def route(device: torch.device, seq_len: int, terms: ScoreTerms | None, table: bool = True,
          grad: bool = False) -> str | None:  # fmt: skip
    """The kernel a forward of ``seq_len`` positions with the bias ``terms`` takes on ``device``: ``"table"``
    (:func:`attend_by_table`; not where ``table`` is False), ``"flex"`` (:func:`attend`) or None (the blocked SDPA
    path). With ``grad`` (training): ``"flex"`` (compiled forward and backward, :mod:`biasviz.model.flex_grad`)
    wherever flex has a backward (not on the CPU) and is not turned off, at any length (thousands of steps pay
    for one compilation); None (the blocked recomputation) elsewhere. The answer of :func:`routes.choose` for a
    call nobody listens to, without dropout.

    Not the table while a torch function mode intercepts calls (``biasviz.trace``): its SDPA calls see blocks of
    rows in reverse order against a strided mask, which a trace would record as they are rather than as the layer.
    """
    facts = routes.Facts(grad=grad, adds_bias=True, hook_bias=False, hook_pattern=False, hook_scores=False,
                         dropout=False, mode=mode(), device=device.type, seq_len=seq_len, min_len=MIN_LEN,
                         table_allowed=table, intercepted=intercepted(), flex_failed=flex_failed(device),
                         backward_runs=backward_runs(device), has_terms=terms is not None,
                         has_table=terms is not None and terms.distance is not None)  # fmt: skip
    chosen = routes.choose(facts).name
    return chosen if chosen in ("table", "flex") else None


def flex_failed(device: torch.device) -> bool:
    """Whether FlexAttention is known not to build on ``device``'s type (a real call or the probe said so)."""
    return _probe.get(device.type) is not None


_taken: collections.Counter[str] = collections.Counter()  # route -> attention calls that took it, this process


def took(name: str) -> None:
    """Count one attention call through the route ``name`` (see :data:`ROUTES`), for the run's record."""
    _taken[name] += 1


def routes_taken() -> dict[str, int]:
    """Each route the attention took since :func:`forget_routes` (or the start), with its calls: what a run records
    (training.json's ``attention_routes``)."""
    return dict(sorted(_taken.items()))


def forget_routes() -> None:
    _taken.clear()


def backward_runs(device: torch.device) -> bool:
    """Whether FlexAttention has a backward on ``device``: not on the CPU (torch raises there)."""
    return device.type != "cpu"


def intercepted() -> bool:
    """Whether a torch function mode (a trace) sees every call now."""
    enabled = getattr(torch._C, "_is_torch_function_mode_enabled", None)
    return bool(enabled()) if enabled is not None else False


def attend_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms: ScoreTerms,
                scale: float) -> torch.Tensor | None:  # fmt: skip
    """:func:`attend` where one more kernel may be compiled (:func:`fits`) and it builds here, else None."""
    return attend_or_none(q, k, v, terms, scale) if fits(q, terms) else None


def attend_by_table(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor, scale: float,
                    rows: int | None = None) -> torch.Tensor:  # fmt: skip
    """Causal softmax(scale * q k^T + f(i - j)) v through SDPA, the mask an overlapping strided view of the
    distance table (H, 2T - 1) (entry m holds f(T - 1 - m)): (B, H, T, hd), no (H, rows, keys) block written.

    A view's strides must be positive, and f(i - j) with rows in order would need a row stride of -1; with the
    rows of a block reversed (a = r1 - 1 - i) the entry is T - r1 + a + j, strides (1, 1). Entries past m = T - 1
    (keys after the query) become -inf in a copy of the table: the causal mask comes with the bias. SDPA's
    ``is_causal`` aligns top-left, which is wrong for a block with r0 > 0; each block sees keys 0..r1-1 only.
    Distances whose weight is below float32's normal numbers for these q and k are -inf too (:func:`negligible`),
    and keys that far from every row of a block are not passed at all.
    """
    B, H, T, hd = q.shape
    rows = rows or TABLE_ROWS
    table = distance.to(q.dtype, copy=True)  # (H, 2T - 1), written below: one copy whatever the dtype
    table[:, T:] = float("-inf")  # d = T - 1 - m < 0
    far = negligible(table, q, k, scale)  # (H,): entries 0 .. far - 1 are -inf in that head
    y = torch.empty(B, T, H, hd, dtype=v.dtype, device=v.device).transpose(1, 2)  # (B, H, T, hd), stored (B, T, H, hd)
    for heads, reach in head_groups(far.tolist(), T, rows):
        qh, kh, vh = (t[:, heads] for t in (q, k, v))  # (B, h, T, hd): views for a run of heads in order
        th = table[heads]  # (h, 2T - 1)
        width, base = th.stride(0), th.storage_offset()
        for r0 in range(0, T, rows):
            r1 = min(T, r0 + rows)
            j0 = first_key(r0, reach, T)  # keys before j0 carry no weight in any row of the block, in any head here
            mask = th.as_strided((1, th.shape[0], r1 - r0, r1 - j0), (0, width, 1, 1), base + T - r1 + j0)
            out = F.scaled_dot_product_attention(qh[:, :, r0:r1].flip(-2), kh[:, :, j0:r1], vh[:, :, j0:r1],
                                                 attn_mask=mask, scale=scale)  # fmt: skip
            y[:, heads, r0:r1] = out.flip(-2)  # (B, h, rows, hd)
    return y


def first_key(r0: int, reach: int, seq_len: int) -> int:
    """The first key a block of rows from ``r0`` weighs when the table's entries 0 .. ``reach`` - 1 are -inf: entry
    T - 1 - r0 + j, its first row's, below ``reach`` for every key j before it (later rows are further away)."""
    return min(r0, max(0, reach - seq_len + 1 + r0))


CALL_CELLS = 1 << 20  # what one more SDPA call costs, counted in (head, query, key) cells (about 1 ms on 2 cores)


def head_groups(far: list[int], seq_len: int, rows: int) -> list[tuple[slice | torch.Tensor, int]]:
    """Heads that share SDPA calls, with the entries -inf in all of them: ``far`` (H,) of :func:`negligible`. Heads
    whose far keys carry no weight (ALiBi's steep slopes) skip them in calls of their own; each call more costs
    :data:`CALL_CELLS`. Contiguous runs of heads sorted by ``far``, chosen for the fewest cells (dynamic programming);
    a run of heads in order is a slice (views), any other set an index tensor."""
    H = len(far)
    blocks = [(r0, min(seq_len, r0 + rows)) for r0 in range(0, seq_len, rows)]

    @functools.cache
    def cells(reach: int) -> int:  # per head: one sum per distinct reach, not per pair of heads
        return sum((r1 - r0) * (r1 - first_key(r0, reach, seq_len)) for r0, r1 in blocks)

    order = sorted(range(H), key=lambda h: -far[h])
    best, cut = [0] + [None] * H, [0] * (H + 1)
    for end in range(1, H + 1):
        for start in range(end):
            cost = best[start] + (end - start) * cells(far[order[end - 1]]) + CALL_CELLS * len(blocks)
            if best[end] is None or cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], H
    while end > 0:
        heads = sorted(order[cut[end] : end])
        span = slice(heads[0], heads[-1] + 1) if heads[-1] - heads[0] + 1 == len(heads) else torch.tensor(heads)
        groups.append((span, far[order[end - 1]]))
        end = cut[end]
    return groups[::-1]


def negligible(table: torch.Tensor, q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Sets to -inf, in place, the entries of ``table`` (H, 2T - 1) whose every cell has a softmax weight below
    exp(UNDERFLOW) for these q and k (B, H, T, hd); returns how many leading entries (the largest distances) are -inf
    in each head, (H,).

    A query's largest score is at least its own cell's (d = 0), so a cell's weight is at most
    exp(scale q_i (k_j - k_i) + f(d) - f(0)) <= exp(2 |scale| max|q| max|k| + f(d) - f(0)). Below exp(-90) (8e-40,
    under float32's smallest normal number 1.2e-38), T such weights change no float32 sum that holds a 1: the
    outputs are the same numbers. What it saves: on CPUs that take a slow path on subnormal numbers (Intel's cores;
    AMD's Zen cores do not), a bias like ALiBi's makes most far cells' weights subnormal, and SDPA took up to 1.8x
    the causal kernel for it; keys that no row of a block weighs at all are left out of its call.
    """
    T = (table.shape[1] + 1) // 2
    qn = torch.linalg.vector_norm(q, dim=-1).amax(dim=(0, 2)).double()  # (H,): NaN or inf leave everything as it is
    kn = torch.linalg.vector_norm(k, dim=-1).amax(dim=(0, 2)).double()
    bound = 2 * abs(scale) * qn * kn * (1 + 1e-3) + 1e-3  # float32 norms and scores: a margin for their rounding
    seen = table[:, :T]  # d = T - 1 .. 0
    cut = (seen.double() - seen[:, T - 1 :].double() + bound[:, None].to(table.device)) < UNDERFLOW  # (H, T)
    seen.masked_fill_(cut, float("-inf"))
    return cut.cumprod(dim=1).sum(dim=1)


def fits(q: torch.Tensor, terms: ScoreTerms) -> bool:
    """Whether one more kernel may be compiled for this shape. torch stops compiling a function after
    ``recompile_limit`` shapes and then runs flex unfused, every (query, key) cell at once: past that, the
    blocked path runs instead."""
    import torch._dynamo.config as dynamo

    # a differentiable call (training) is a graph of its own beside the forward's
    key = (tuple(q.shape), q.dtype, q.device.type, terms.distance is not None,
           torch.is_grad_enabled() and q.requires_grad)  # fmt: skip
    if key in _shapes:
        return True
    if len(_shapes) >= getattr(dynamo, "recompile_limit", getattr(dynamo, "cache_size_limit", 8)) - 1:
        return False
    _shapes.add(key)
    return True


def unavailable(device: torch.device) -> str | None:
    """None when compiled FlexAttention runs on this device type, else why not (a small kernel compiled once per
    process, unless a real call has already told)."""
    with _probe_lock:
        if device.type not in _probe:
            q = torch.randn(1, 2, 2 * BLOCK, 16, device=device)
            out = attend_or_none(q, q, q, ScoreTerms(distance=torch.randn(2, 4 * BLOCK - 1, device=device)), 0.25)
            if out is not None and not bool(torch.isfinite(out).all()):
                _failed(device, "FlexAttention returned non-finite values")
        return _probe[device.type]


def _failed(device: torch.device, why: str | None) -> None:
    _probe[device.type] = why
    if why is not None:
        warnings.warn(f"FlexAttention does not run on {device.type} here ({why}); attention takes the blocked "
                      "SDPA path (the same numbers, slower at long lengths)", stacklevel=3)  # fmt: skip


def attend_or_none(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms: ScoreTerms, scale: float):
    """:func:`attend`, or None where the kernel cannot be built here (then noted once, and never tried again).

    The first call on a device is its probe: no separate kernel is compiled to find out (a compilation costs
    5-10 s on 2 CPU cores, a tenth of a forward at T = 8192)."""
    try:
        out = attend(q, k, v, terms, scale)
    except Exception as err:  # a missing compiler, an unsupported device: the blocked SDPA path is used
        if _probe.get(q.device.type, "") is None:  # it ran before on this device: a real error, not the compiler
            raise
        _failed(q.device, f"{type(err).__name__}: {err}".splitlines()[0][:200])
        return None
    _probe.setdefault(q.device.type, None)
    return out


@functools.lru_cache(maxsize=8)
def causal_block_mask(seq_len: int, device: torch.device):  # -> BlockMask
    """The causal mask as flex's block structure, built from its known shape (no T x T evaluation): query block r
    reads the key blocks wholly at or before its first query whole, and those crossing its rows through the mask.
    On the CPU the blocks are also the kernel's tiles (Q_BLOCK x KV_BLOCK)."""
    from torch.nn.attention.flex_attention import BlockMask

    bq, bk = blocks(device)
    nq, nk = -(-seq_len // bq), -(-seq_len // bk)
    first_q = torch.arange(nq, device=device) * bq  # (nq,)
    last_q = torch.clamp(first_q + bq - 1, max=seq_len - 1)
    last_k = torch.arange(nk, device=device) * bk + bk - 1  # (nk,)
    full = last_k[None, :] <= first_q[:, None]  # (nq, nk): every key of the block at or before every query
    seen = (torch.arange(nk, device=device) * bk)[None, :] <= last_q[:, None]  # some key at or before some query
    partial = seen & ~full

    def packed(which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = which.sum(-1, dtype=torch.int32)  # (nq,)
        order = torch.argsort((~which).to(torch.int8), dim=-1, stable=True).to(torch.int32)  # chosen blocks first
        return counts.view(1, 1, nq), order.view(1, 1, nq, nk).contiguous()

    kv_num, kv_idx = packed(partial)
    full_num, full_idx = packed(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(bq, bk), mask_mod=_causal,
                                    seq_lengths=(seq_len, seq_len))  # fmt: skip


def blocks(device: torch.device) -> tuple[int, int]:
    """(query, key) block of the mask: on the CPU the kernel's tiles (Q_BLOCK x KV_BLOCK); elsewhere flex's
    default, 128."""
    if device.type == "cpu":
        return Q_BLOCK, KV_BLOCK
    return BLOCK, BLOCK


def _causal(b: torch.Tensor, h: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    return i >= j


@functools.cache
def _compiled() -> Callable[..., torch.Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def score_mod(terms: ScoreTerms, seq_len: int) -> Callable[..., torch.Tensor]:
    """The bias as flex's ``score_mod``: the scaled score plus b(i, j), in the same float32 arithmetic as the
    bias blocks the other paths form (the scheme's formula of a head's parameters and i - j; else its distance table
    read at i - j; or s_i - s_j, one subtraction)."""
    if terms.formula is not None:  # arithmetic on a head's parameters, in registers: no table read per cell
        value, params = terms.formula

        def by_formula(s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, i: torch.Tensor, j: torch.Tensor):
            return s + value(params, h, i - j)

        return by_formula
    if terms.distance is not None:
        table, last = terms.distance, seq_len - 1  # entry m holds d = T - 1 - m

        def by_distance(s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, i: torch.Tensor, j: torch.Tensor):
            return s + table[h, last - (i - j)]

        return by_distance
    ends = terms.ends  # (B, H, T)

    def by_ends(s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, i: torch.Tensor, j: torch.Tensor):
        return s + (ends[b, h, i] - ends[b, h, j])

    return by_ends


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms: ScoreTerms, scale: float) -> torch.Tensor:
    """Causal softmax(scale * q k^T + b) v with the bias ``terms``: q, k, v (B, H, T, hd) -> (B, H, T, hd)."""
    T = q.shape[-2]
    return _compiled()(q, k, v, score_mod=score_mod(terms, T), block_mask=causal_block_mask(T, q.device), scale=scale)
