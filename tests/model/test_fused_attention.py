"""The fused attention (FlexAttention with the bias as a score_mod) against float64 math and the blocked path.

Every registered scheme, at a length of several flex blocks that is not a multiple of one (300 = 2 x 128 + 44),
with a batch of two windows one of which is padded with one token: the model's logits and every hook's blocks
with flex must equal the blocked SDPA path, and one attention layer must equal softmax(scale q k^T + b) v formed
in float64 from the scheme's own full ``bias``. Skipped where torch's compiler cannot build the kernel.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM, capture, fused
from biasviz.schemes import SCHEMES

T = 300  # > 2 flex blocks, not a multiple of 128


@pytest.fixture(autouse=True)
def _compiler() -> None:
    """Skip where torch's compiler cannot build the kernel (checked when a test here runs, not at collection)."""
    why = fused.unavailable(torch.device("cpu"))
    if why is not None:
        pytest.skip(f"FlexAttention cannot compile here: {why}")


def model_of(scheme: str, seed: int = 0, **extra) -> BiasGPTForCausalLM:
    torch.manual_seed(seed)
    config = BiasGPTConfig(scheme=scheme, n_layer=2, n_head=4, n_embd=64, vocab_size=97, n_positions=512, **extra)
    model = BiasGPTForCausalLM(config).eval()
    with torch.no_grad():  # trained-looking parameters: schemes start at values that hide mistakes (T5's 0 table)
        for name, p in model.named_parameters():
            if "pos_bias" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def windows() -> torch.Tensor:
    ids = torch.randint(1, 97, (2, T), generator=torch.Generator().manual_seed(1))
    ids[1, T - 60 :] = 0  # the second window padded at its end with token 0
    return ids


def run(model: BiasGPTForCausalLM, ids: torch.Tensor, mode: str, monkeypatch) -> tuple[torch.Tensor, dict]:
    """Logits, and layer 1's bias and weights as the hooks see them (blocks put back together)."""
    monkeypatch.setenv("BIASVIZ_ATTENTION", mode)
    seen: dict[str, torch.Tensor] = {}

    def keep(t: torch.Tensor, name: str, r0: int) -> None:
        full = seen.setdefault(name, torch.zeros(t.shape[0], t.shape[1], T, T))
        full[:, :, r0 : r0 + t.shape[2], : t.shape[3]] = t

    points = ["blocks.1.attn.hook_pattern"] + (["blocks.1.attn.hook_bias"] if model.blocks[1].attn.adds_bias else [])
    with torch.no_grad(), capture(model, points, keep):
        logits = model(ids).logits
    return logits, seen


def layer_and_float64(attn) -> tuple[torch.Tensor, torch.Tensor]:
    """One attention layer's output on a random (2, T, 64) input, and softmax(scale q k^T + b) v in float64 with b
    the scheme's own full (B or 1, H, T, T) ``bias`` (not the table or cumulative sums a kernel reads)."""
    x = torch.randn(2, T, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = attn(x)
        ref = copy.deepcopy(attn).double()
        B, H, hd = 2, ref.n_head, ref.head_dim
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in ref.c_attn(x.double()).split(64, dim=2))
        scores = q @ k.transpose(-2, -1) / math.sqrt(hd) + ref.pos_bias.bias(x.double(), T, T)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, 64)
        return out, ref.c_proj(y)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_flex_equals_blocked_path(scheme: str, monkeypatch) -> None:
    model, ids = model_of(scheme), windows()
    flex_logits, flex_seen = run(model, ids, "flex", monkeypatch)
    sdpa_logits, sdpa_seen = run(model, ids, "sdpa", monkeypatch)
    scale = sdpa_logits.abs().max()
    assert (flex_logits - sdpa_logits).abs().max() <= 1e-5 * scale
    assert flex_seen.keys() == sdpa_seen.keys()
    for name in flex_seen:  # within float32 rounding of the largest value (CABLE's sums of hundreds of costs)
        atol = 1e-5 * max(1.0, sdpa_seen[name].abs().max().item())
        torch.testing.assert_close(flex_seen[name], sdpa_seen[name], rtol=1e-5, atol=atol)


def test_flex_runs_where_a_bias_has_a_kernel_form(monkeypatch) -> None:
    """The fused path is taken for schemes with score terms (not silently the blocked one), never for FIRE, and
    never for a layer someone listens to (here layer 1: its weights are formed by the eager path)."""
    calls: list[str] = []
    real = fused.attend

    def counted(q, k, v, terms, scale):
        calls.append("distance" if terms.distance is not None else "ends")
        return real(q, k, v, terms, scale)

    monkeypatch.setattr(fused, "attend", counted)
    for scheme, expected in [("alibi", ["distance"]), ("cable", ["ends"]), ("fire", [])]:
        calls.clear()
        run(model_of(scheme), windows(), "flex", monkeypatch)
        assert calls == expected, scheme


@pytest.mark.parametrize("scheme", ["alibi", "kerple-log", "kerple-power", "t5", "cable", "fox"])
def test_flex_layer_equals_float64_math(scheme: str, monkeypatch) -> None:
    """One attention layer through the kernel against softmax(scale q k^T + b) v in float64, b the scheme's own
    full (B or 1, H, T, T) ``bias`` (not the table or cumulative sums the kernel reads)."""
    monkeypatch.setenv("BIASVIZ_ATTENTION", "flex")
    out, expected = layer_and_float64(model_of(scheme).blocks[0].attn)
    assert (out.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


@pytest.mark.parametrize("scheme", ["alibi", "kerple-log", "kerple-power"])
def test_a_formula_gives_the_tables_entries(scheme: str) -> None:
    """The arithmetic a compiled kernel evaluates cell by cell equals the table the other paths read, bit for bit:
    every head, every distance d >= 0 of a length."""
    module = model_of(scheme).blocks[0].attn.pos_bias
    terms = module.score_terms(torch.zeros(1, T, 1))
    assert terms is not None and terms.formula is not None
    value, params = terms.formula
    h, d = torch.meshgrid(torch.arange(module.n_head), torch.arange(T), indexing="ij")
    assert torch.equal(value(params, h, d), terms.distance[:, T - 1 - torch.arange(T)])


def test_without_a_compiler_the_blocked_path_runs(monkeypatch) -> None:
    """When the kernel cannot be compiled, the probe says why and forwards take the blocked SDPA path."""
    def broken():
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(fused, "_compiled", broken)
    monkeypatch.setattr(fused, "_probe", {})
    with pytest.warns(UserWarning, match="blocked SDPA path"):
        assert "no C++ compiler" in fused.unavailable(torch.device("cpu"))
    model, ids = model_of("alibi"), windows()
    logits, _ = run(model, ids, "flex", monkeypatch)  # would raise through `broken` if flex were called
    reference, _ = run(model, ids, "sdpa", monkeypatch)
    assert torch.equal(logits, reference)


def test_a_failing_first_call_falls_back_once(monkeypatch) -> None:
    """No probe kernel is compiled before a forward: its first call is the probe. When it fails, the forward
    takes the blocked path with the same numbers, says so once, and later forwards never try again."""
    tries: list[int] = []

    def broken():
        tries.append(1)
        raise RuntimeError("no C++ compiler")

    model, ids = model_of("t5"), windows()
    monkeypatch.setenv("BIASVIZ_ATTENTION", "sdpa")
    with torch.no_grad():
        reference = model(ids).logits
    monkeypatch.setattr(fused, "_compiled", broken)
    monkeypatch.setattr(fused, "_probe", {})
    monkeypatch.setenv("BIASVIZ_ATTENTION", "flex")
    with torch.no_grad():
        with pytest.warns(UserWarning, match="no C\\+\\+ compiler"):
            first = model(ids).logits
        second = model(ids).logits
    assert torch.equal(first, reference) and torch.equal(second, reference)
    assert len(tries) == 1


@pytest.mark.parametrize("tiles", [(128, 128), (256, 512), (512, 256)])
def test_causal_block_mask_is_the_causal_mask(tiles: tuple[int, int], monkeypatch) -> None:
    """The block structure built from its shape against i >= j evaluated cell by cell over the T x T cells: a block
    is read (whole or through the mask) exactly when one of its cells has j <= i, and read whole only when all do."""
    monkeypatch.setattr(fused, "Q_BLOCK", tiles[0])
    monkeypatch.setattr(fused, "KV_BLOCK", tiles[1])
    fused.causal_block_mask.cache_clear()
    bq, bk = tiles

    def blocks_of(num: torch.Tensor, idx: torch.Tensor) -> set[tuple[int, int]]:
        return {(r, int(c)) for r in range(num.shape[-1]) for c in idx[0, 0, r, : num[0, 0, r]]}

    try:
        for n in (130, 300, 1100):
            built = fused.causal_block_mask(n, torch.device("cpu"))
            whole = blocks_of(built.full_kv_num_blocks, built.full_kv_indices)
            masked = blocks_of(built.kv_num_blocks, built.kv_indices)
            i = torch.arange(n)
            keep = i[:, None] >= i[None, :]  # (n, n)
            for r in range(-(-n // bq)):
                for c in range(-(-n // bk)):
                    cells = keep[r * bq : (r + 1) * bq, c * bk : (c + 1) * bk]
                    assert ((r, c) in whole or (r, c) in masked) == bool(cells.any()), (n, r, c)
                    assert (r, c) not in whole or bool(cells.all()), (n, r, c)
                    assert not ((r, c) in whole and (r, c) in masked)
    finally:
        fused.causal_block_mask.cache_clear()


def test_no_more_kernels_than_torch_compiles(monkeypatch) -> None:
    """Past torch's recompile limit flex would run unfused (every cell at once): new shapes take the blocked path,
    shapes already compiled keep the kernel."""
    import torch._dynamo.config as dynamo

    monkeypatch.setattr(fused, "_shapes", set())
    limit = getattr(dynamo, "recompile_limit", getattr(dynamo, "cache_size_limit", 8))
    terms = fused.ScoreTerms(distance=torch.zeros(1, 1))
    shapes = [torch.empty(1, 2, n, 8) for n in range(2, limit + 4)]
    allowed = [fused.fits(q, terms) for q in shapes]
    assert allowed == [True] * (limit - 1) + [False] * 3
    assert fused.fits(shapes[0], terms)
    # a differentiable call of a compiled shape is a compilation of its own (training beside evaluation)
    assert not fused.fits(shapes[0].clone().requires_grad_(), terms)


@pytest.mark.cuda
@pytest.mark.parametrize("scheme", ["alibi", "t5", "cable"])
def test_flex_on_cuda_equals_blocked_path(scheme: str, monkeypatch) -> None:
    """On a GPU the kernel is compiled by Triton: the same comparison."""
    if fused.unavailable(torch.device("cuda")) is not None:
        pytest.skip(f"FlexAttention cannot compile on this GPU: {fused.unavailable(torch.device('cuda'))}")
    model, ids = model_of(scheme).cuda(), windows().cuda()
    flex, _ = run(model, ids, "flex", monkeypatch)
    sdpa, _ = run(model, ids, "sdpa", monkeypatch)
    assert (flex - sdpa).abs().max() <= 1e-5 * sdpa.abs().max()
