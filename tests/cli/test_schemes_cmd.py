"""``biasviz schemes`` (:mod:`biasviz.cli.schemes_cmd`): the ten schemes in listing order, as a two-line table, as
JSON and as README's Markdown table, against what the papers define (names, aliases, which depend on the input)."""

from __future__ import annotations

import json

import pytest

from biasviz.cli.schemes_cmd import scheme_rows
from tests.conftest import run_cli

NAMES = ["alibi", "kerple-log", "kerple-power", "fire", "t5", "cable", "fox", "rope", "learned", "nope"]
CONTEXT_DEPENDENT = {"cable", "fox"}  # the bias is a sum over the tokens between j and i
ALIASES = {"kerple-log": ["kerple"], "t5": ["t5-bias"]}


def test_one_row_per_scheme_in_listing_order() -> None:
    rows = scheme_rows()
    assert [r["name"] for r in rows] == NAMES
    assert {r["name"] for r in rows if r["context_dependent"]} == CONTEXT_DEPENDENT
    assert {r["name"]: r["aliases"] for r in rows if r["aliases"]} == ALIASES
    by_name = {r["name"]: r for r in rows}
    assert by_name["alibi"]["bias"] == "-m_h * d" and by_name["alibi"]["options"] == {"slopes": "geometric"}
    assert by_name["t5"]["options"] == {"num_buckets": 32, "max_distance": 128}  # T5's defaults
    assert "ICLR 2022" in by_name["alibi"]["reference"] and "NeurIPS 2022" in by_name["kerple-log"]["reference"]
    assert set(rows[0]) == {"name", "aliases", "bias", "context_dependent", "options", "reference"}


def test_the_table_is_two_lines_a_scheme_aligned_on_the_longest_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["schemes"], capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) == 2 * len(NAMES)
    width = len("kerple-power")  # the longest name
    assert lines[0] == "alibi" + " " * (width - 5) + "  -m_h * d"
    assert lines[1] == " " * (width + 2) + "context-independent; Press, Smith & Lewis, ICLR 2022 (ALiBi)"
    assert lines[2].startswith("kerple-log    -r1_h * log(1 + r2_h * d)")
    assert lines[3].endswith("(KERPLE) (alias kerple)")
    dependence = dict(zip(lines[0::2], lines[1::2], strict=True))
    for name in NAMES:
        (first,) = [line for line in dependence if line.split()[0] == name]
        said = "context-dependent" if name in CONTEXT_DEPENDENT else "context-independent"
        assert dependence[first].strip().startswith(said + ";"), name


def test_json_is_the_rows(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["schemes", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc == scheme_rows()
    assert [r["name"] for r in doc] == NAMES


def test_markdown_is_readmes_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["schemes", "--markdown"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[:2] == ["| scheme | aliases | b_h(i, j), d = i - j | depends on input | reference |",
                         "| --- | --- | --- | --- | --- |"]  # fmt: skip
    assert len(lines) == 2 + len(NAMES)
    assert lines[2] == "| `alibi` | — | `-m_h * d` | no | Press, Smith & Lewis, ICLR 2022 (ALiBi) |"
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:]]
    assert [c[0] for c in cells] == [f"`{n}`" for n in NAMES]
    assert {c[0].strip("`"): c[1] for c in cells if c[1] != "—"} == {"kerple-log": "`kerple`", "t5": "`t5-bias`"}
    assert {c[0].strip("`") for c in cells if c[3] == "yes"} == CONTEXT_DEPENDENT
