"""JSON from outside is bounded before it is parsed (:mod:`biasviz.common.jsondoc`): a document nested deeper than
64 levels or larger than the size allowed is one JSONTooLarge (a BiasvizError and a ValueError) naming the
document, never a RecursionError; anything else reads as ``json.loads`` reads it."""

from __future__ import annotations

import json

import pytest

from biasviz.common.errors import BiasvizError
from biasviz.common.jsondoc import JSONTooLarge, loads, nesting


def nested(depth: int) -> str:
    """``depth`` levels of arrays and objects, alternating, around a number: ``[{"k": [1]}]`` for 3."""
    text = "1"
    for level in range(depth):
        text = f'{{"k": {text}}}' if level % 2 else f"[{text}]"
    return text


@pytest.mark.parametrize(("text", "want"), [
    ("3", 0), ("[]", 1), ("{}", 1), ("[[], [], {}]", 2), ('{"a": [1, {"b": 2}]}', 3),
    ('"[[[{{{"', 0),  # brackets inside a string are text
    ('["\\"[[", {"x": "]]\\\\"}]', 2),  # an escaped quote does not end the string; an escaped backslash does
])  # fmt: skip
def test_nesting_counts_the_deepest_bracket_outside_strings(text: str, want: int) -> None:
    assert nesting(text) == want


@pytest.mark.parametrize("depth", [1, 2, 17, 64, 65, 300])
def test_nesting_of_a_generated_document_is_its_depth(depth: int) -> None:
    assert nesting(nested(depth)) == depth


def test_a_document_64_levels_deep_reads_as_json_reads_it() -> None:
    text = nested(64)
    assert loads(text, "doc") == json.loads(text)
    assert loads(text.encode(), "doc") == json.loads(text)  # bytes are read as UTF-8


def test_one_level_more_is_refused_naming_the_document() -> None:
    with pytest.raises(JSONTooLarge, match=r"config\.json of run nests arrays or objects more than 64 levels"):
        loads(nested(65), "config.json of run")


def test_many_brackets_side_by_side_are_not_depth() -> None:
    """Hundreds of brackets, none deeper than 2: not refused (the bound is on nesting, not on count)."""
    text = json.dumps([[i] for i in range(500)])
    assert loads(text, "doc") == [[i] for i in range(500)]


def test_the_refusals_are_biasviz_errors_and_value_errors() -> None:
    """Callers that catch ValueError for malformed JSON catch the refusals too; the CLI prints them as one line."""
    assert issubclass(JSONTooLarge, BiasvizError) and issubclass(JSONTooLarge, ValueError)


def test_a_document_nested_50000_deep_is_refused_not_a_recursion_error() -> None:
    with pytest.raises(JSONTooLarge):
        loads("[" * 50_000 + "]" * 50_000, "doc")


def test_a_document_larger_than_allowed_is_refused_with_its_size() -> None:
    text = json.dumps({"x": "a" * 2_000_000})  # 2,000,011 characters
    with pytest.raises(JSONTooLarge, match=r"--device-map m\.json is 2\.0 MB of JSON, more than the 1 MB"):
        loads(text, "--device-map m.json", max_bytes=1_000_000)
    assert loads(text, "doc", max_bytes=len(text)) == {"x": "a" * 2_000_000}  # exactly the size allowed: read


@pytest.mark.parametrize("text", ['{"a": 1', "[1, 2,]", "nan?", ""])
def test_malformed_json_is_jsons_own_error(text: str) -> None:
    """Not a refusal: json's JSONDecodeError, as a caller that read json before expects."""
    with pytest.raises(json.JSONDecodeError):
        loads(text, "doc")
