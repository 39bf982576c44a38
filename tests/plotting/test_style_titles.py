"""A long figure title wraps between terms: never inside "T = 64", never past the width it is given."""

from __future__ import annotations

import re

import pytest

from biasviz.plotting.style import VENUE_WIDTHS, font_sizes, wrap_title

TITLES = [
    "diffllama diagnostics: attention call 3 of 4 (model.layers.1.self_attn), positional logits, T = 64, N = 4",
    "bias: layer 12 of 12, T = 32768, N = 128, R = 1024; P(d) − P(0) by distance d = i − j, sample 1 of 3",
    "weights over the keys a query sees: d ≤ 8 against d > 8, c × q · k, 95 % bands, T = 4096, N = 8",
    "umt5 bias: attention call 3 of 6 (decoder.block.0.layer.0.SelfAttention); T = 48; sample 1 of 3",
]
RELATIONS = "=≠<>≤≥≈−+×·"


@pytest.mark.parametrize("width", sorted(set(VENUE_WIDTHS.values())) + [2.0])
@pytest.mark.parametrize("title", TITLES)
def test_no_line_breaks_beside_a_relation(title: str, width: float) -> None:
    lines = wrap_title(title, width).split("\n")
    assert "".join("".join(lines).split()) == "".join(title.split())  # the text itself unchanged
    for before, after in zip(lines, lines[1:], strict=False):
        assert after[0] not in RELATIONS, (before, after)
        assert before[-1] not in RELATIONS, (before, after)
        assert not re.search(r"(\d of|[A-Za-z] \d+ of)$", before), (before, after)  # "sample 1 of 3" whole
        assert not re.match(r"(of \d|\d+ of \d)", after), (before, after)
    limit = max(20, int(width * 72 / (0.47 * font_sizes(width)["base"])))
    # a line is over the limit only where one term (no space inside) is longer
    assert all(len(line) <= limit or " " not in line.strip() for line in lines), (limit, lines)


def test_the_bound_terms_are_the_ones_a_line_could_have_split() -> None:
    """At a width where plain wrapping puts "= 64" at the start of a line, "T = 64" moves down whole."""
    import textwrap

    title = TITLES[0]
    width = next(w for w in (x / 100 for x in range(200, 800, 5))
                 if re.search(r"\n[=]", textwrap.fill(title, max(20, int(w * 72 / (0.47 * font_sizes(w)["base"]))),
                                                      break_on_hyphens=False)))  # fmt: skip
    lines = wrap_title(title, width).split("\n")
    assert any("T = 64" in line for line in lines), lines


def test_a_title_with_no_relation_wraps_as_before() -> None:
    import textwrap

    title = "a long title of plain words that wraps at a narrow width, and a module model.layers.0.self_attn too"
    width = VENUE_WIDTHS["acl-column"]
    expected = textwrap.fill(title, max(20, int(width * 72 / (0.47 * font_sizes(width)["base"]))),
                             break_on_hyphens=False)  # fmt: skip
    assert wrap_title(title, width) == expected
