"""Which way one attention call goes: every fact the choice reads, as plain values, and one function that reads
them. The attention (:class:`biasviz.model.modeling.Attention`) gathers the facts, asks :func:`choose` and runs
the route it names; :func:`biasviz.model.fused.route` answers from the same function for its other callers.

The routes are those of :data:`biasviz.model.fused.ROUTES`. A compiled kernel may still not run when tried (no
compiler, torch's recompile limit): a :class:`Route` names the route taken then (its ``fallback``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Facts:
    """What one attention call's route depends on."""

    grad: bool  # autograd sees the forward (training)
    adds_bias: bool  # the scheme adds a bias to the scores
    hook_bias: bool  # someone listens at the bias
    hook_pattern: bool  # ... at the weights
    hook_scores: bool  # ... at the scores
    dropout: bool  # dropout on the weights (training, with a dropout rate)
    mode: str  # BIASVIZ_ATTENTION: auto, flex, table or sdpa
    device: str  # the device type: cpu, cuda, ...
    seq_len: int
    min_len: int  # the shortest length worth a compilation (fused.MIN_LEN)
    one_block: bool = False  # training: every cell fits in one block of the recomputation
    table_allowed: bool = True  # the distance table may run (not where blocks of rows are asked for)
    intercepted: bool = False  # a torch function mode (a trace) sees every call
    flex_failed: bool = False  # FlexAttention is known not to build on this device
    backward_runs: bool = False  # FlexAttention has a backward on this device (not the CPU)
    has_terms: bool = False  # the bias has a compact form (ScoreTerms); read only where asks_terms says so
    has_table: bool = False  # ... and that form holds a distance table


@dataclass(frozen=True)
class Route:
    """The route to take, and the one taken where its kernel does not run here (None: it always runs)."""

    name: str
    fallback: str | None = None


def asks_terms(facts: Facts) -> bool:
    """Whether the route depends on the bias's compact form: only then is it formed (the scheme's
    ``score_terms``, a pass over the input for some)."""
    if not facts.adds_bias or facts.dropout or facts.mode == "sdpa":
        return False
    if facts.grad:
        listened = facts.hook_bias or facts.hook_pattern or facts.hook_scores
        return not listened and not (facts.device == "cpu" and facts.one_block)
    return not (facts.hook_pattern or facts.hook_scores or facts.hook_bias)


def choose(facts: Facts) -> Route:
    """The route of one attention call (see :data:`biasviz.model.fused.ROUTES`).

    Training: a compact bias nobody listens to, without dropout, goes through compiled FlexAttention forward and
    backward where flex has a backward and is not turned off, else through the blocked recomputation; on the CPU
    attention that fits in one block of it is kept whole instead. Everything else is formed whole: SDPA's causal
    kernel without a bias (and without a hook on the weights), every cell at once with one.

    Without autograd: no bias and nobody listening at the weights or scores is SDPA's causal kernel; listening
    there forms the weights block by block (eager). A compact bias nobody listens to, without dropout and not
    ``sdpa``, goes through the strided distance table (on the CPU by default, or wherever ``table`` asks, unless
    blocks of rows are asked for or a trace intercepts calls), else FlexAttention where the length is worth a
    compilation (any length with ``flex``) and it builds; else blocks of rows through SDPA.
    """
    if facts.grad:
        if asks_terms(facts) and facts.has_terms:
            flex = facts.backward_runs and facts.mode in ("auto", "flex") and not facts.flex_failed
            return Route("flex", "blocked-grad") if flex else Route("blocked-grad")
        return Route("dense" if facts.adds_bias or facts.hook_pattern else "causal")
    eager = facts.hook_pattern or facts.hook_scores
    if not (eager or facts.adds_bias):
        return Route("causal")
    slow = Route("eager" if eager else "blocked")
    if not (asks_terms(facts) and facts.has_terms):
        return slow
    table = facts.table_allowed and facts.has_table and not facts.intercepted
    if table and (facts.mode == "table" or (facts.mode == "auto" and facts.device == "cpu")):
        return Route("table")
    if facts.mode == "table" or (facts.mode == "auto" and facts.seq_len < facts.min_len) or facts.flex_failed:
        return slow
    return Route("flex", slow.name)


__all__ = ["Facts", "Route", "asks_terms", "choose"]
