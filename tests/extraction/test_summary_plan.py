"""Where a summary starts (:mod:`biasviz.extraction.summary_plan`): every combination of the facts against the rules as
docs/hdf5.md ('Summary files') and the module's text state them, one at a time, and the cases a user meets by name."""

from __future__ import annotations

import itertools

from biasviz.extraction.summary_plan import SummaryFacts, SummaryPlan, plan

FLAGS = ("forms_rows_again", "captures_scores", "adds_bias", "declared_shared", "merged", "gathered", "streamed")


def every_case():
    for values in itertools.product((False, True), repeat=len(FLAGS)):
        for samples, batch in ((4, 1), (4, 3), (4, 4), (4, 8), (1, 1)):
            yield SummaryFacts(**dict(zip(FLAGS, values, strict=True)), samples=samples, batch_size=batch)


def test_every_combination_follows_each_rule():
    cases = list(every_case())
    assert len(cases) == 2 ** len(FLAGS) * 5
    for facts in cases:
        follows_each_rule(facts)


def follows_each_rule(facts: SummaryFacts) -> None:
    got = plan(facts)
    # rows are formed again only by an adapter that can, not asked to stream, and in one process or with every
    # process's bank joined
    one_bank = not facts.merged or facts.gathered
    assert got.formed_again == (facts.forms_rows_again and not facts.streamed and one_bank)
    # how samples meet: rows formed again bring every sample of a block at once; streamed ones do where one batch
    # holds every sample and no other process's moments are to be joined
    every_sample_at_once = got.formed_again or (facts.batch_size >= facts.samples and not facts.merged)
    meet = "joint" if every_sample_at_once else "cells"
    assert got.modes["weights"] == meet
    # the scores: formed again with the weights, or sent by a streamed adapter that captures them
    assert ("scores" in got.modes) == (got.formed_again or facts.captures_scores)
    assert got.streamed_position == (not got.formed_again and facts.captures_scores)
    if "scores" in got.modes:
        assert got.modes["scores"] == meet
    # the bias: only where the scheme adds one; shared (measured) where declared, unless processes join moments that
    # cannot be compared with process 0's first sample
    assert ("bias" in got.modes) == facts.adds_bias
    if facts.adds_bias:
        compared = got.formed_again or not facts.merged
        assert got.modes["bias"] == ("shared" if facts.declared_shared and compared else meet)
    assert set(got.modes) <= {"weights", "scores", "bias"}
    assert all(mode in ("shared", "joint", "cells") for mode in got.modes.values())
    # a streamed forward takes every sample at once where they meet joint, else the batch asked for
    if not got.formed_again:
        assert got.forward_batch == (facts.samples if meet == "joint" else facts.batch_size)


def facts(**given) -> SummaryFacts:
    base = {flag: False for flag in FLAGS} | {"samples": 8, "batch_size": 1}
    return SummaryFacts(**(base | given))


def test_the_cases_users_meet():
    # biasviz's own ALiBi model, one process, one sample a forward
    assert plan(facts(forms_rows_again=True, captures_scores=True, adds_bias=True, declared_shared=True)) == \
        SummaryPlan(True, {"weights": "joint", "scores": "joint", "bias": "shared"}, False, 1)  # fmt: skip
    # CABLE (a bias that depends on the input): summarised per sample from the start
    assert plan(facts(forms_rows_again=True, captures_scores=True, adds_bias=True)).modes["bias"] == "joint"
    # a Bloom (hooks see whole calls) in batches of 2: per-cell moments across batches
    assert plan(facts(adds_bias=True, declared_shared=True, batch_size=2)) == \
        SummaryPlan(False, {"weights": "cells", "bias": "shared"}, False, 2)  # fmt: skip
    # ... in one batch: every sample at once
    assert plan(facts(adds_bias=True, declared_shared=True, batch_size=8)).modes["weights"] == "joint"
    # an encoder that adds no bias (its rows formed again against every key) and a causal model alike
    assert plan(facts(forms_rows_again=True)).formed_again
    # rows formed again that could not hold a call's cells: streamed from the first sample, with the scores
    again = plan(facts(forms_rows_again=True, captures_scores=True, streamed=True))
    assert not again.formed_again and again.streamed_position and again.modes["scores"] == "cells"
    # torchrun, streamed: a declared bias is summarised per sample (no first sample to compare with)
    assert plan(facts(adds_bias=True, declared_shared=True, merged=True, batch_size=8)).modes == \
        {"weights": "cells", "bias": "cells"}  # fmt: skip
    # torchrun with banks joined: formed again on process 0, a declared bias still measured
    assert plan(facts(forms_rows_again=True, adds_bias=True, declared_shared=True, merged=True, gathered=True)) == \
        SummaryPlan(True, {"weights": "joint", "scores": "joint", "bias": "shared"}, False, 1)  # fmt: skip


def test_what_a_streamed_summary_keeps_of_each_layer_counted_by_hand():
    cells = 4 * 64 * 64  # heads x T x T
    # a Bloom over batches of 2 of 8 samples: the weights' float64 moments (16 bytes a cell), the declared bias's first
    # sample's rows (2 bytes at the least), no scores sent
    bloom = plan(facts(adds_bias=True, declared_shared=True, batch_size=2))
    assert bloom.streamed_bytes(4, 64, samples=8, positional=True) == (16 + 2) * cells
    # eager attention that sends its scores, a bias of the input: three quantities' moments, P's float32 sums of the
    # scores and the bias; without P only the moments
    eager = plan(facts(captures_scores=True, adds_bias=True))
    assert eager.streamed_bytes(4, 64, samples=8, positional=True) == (3 * 16 + 4 + 4) * cells
    assert eager.streamed_bytes(4, 64, samples=8, positional=False) == 3 * 16 * cells
    # every sample in one forward: nothing kept across batches (the forward's own matrices are the batch's)
    assert plan(facts(captures_scores=True, batch_size=8)).streamed_bytes(4, 64, samples=8, positional=False) == 0
    # rows formed again keep nothing of the kind
    assert plan(facts(forms_rows_again=True, adds_bias=True)).streamed_bytes(4, 64, samples=8, positional=True) == 0
