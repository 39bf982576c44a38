"""The notebook API's index check (:mod:`biasviz.common.arguments`): Python and numpy integers only (never a bool, a
float or a string), one of the values the file holds, -1 the last where allowed; and the messages that list them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from biasviz.common.arguments import ArgumentTypeError, ArgumentValueError, listed, pick, whole
from biasviz.common.errors import BiasvizError


@pytest.mark.parametrize(("values", "want"), [
    ([], "none"), ([7], "7"), ([0, 1], "0, 1"), ([0, 1, 2, 3], "0 to 3"), ([5, 6, 7], "5 to 7"), ([1, 3], "1, 3"),
    ([3, 2, 1], "3, 2, 1"),  # consecutive only upwards
    (list(range(0, 24, 2)), "0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22"),  # 12: all of them
    (list(range(0, 26, 2)), "0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, ... (13 in all)"),
    (list(range(100)), "0 to 99"),  # a run is never cut
])  # fmt: skip
def test_listed(values: list[int], want: str) -> None:
    assert listed(values) == want


def test_listed_stops_at_most() -> None:
    assert listed([1, 5, 9], most=2) == "1, 5, ... (3 in all)"


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), np.uint8(3)])
def test_whole_takes_python_and_numpy_integers_as_int(value: Any) -> None:
    got = whole("layer", value, "it holds layers 0 to 3")
    assert got == 3 and type(got) is int


@pytest.mark.parametrize(("value", "shown"), [
    (True, "True (bool)"), (3.0, "3.0 (float)"), ("3", "'3' (str)"), (None, "None (NoneType)"),
    (np.float32(3), f"{np.float32(3)!r} (float32)"),  # numpy's own repr, which numpy 2 changed
])  # fmt: skip
def test_whole_refuses_every_other_kind(value: Any, shown: str) -> None:
    with pytest.raises(ArgumentTypeError) as refused:
        whole("layer", value, "it holds layers 0 to 3")
    assert str(refused.value) == f"layer must be an integer, not {shown}; it holds layers 0 to 3"
    assert isinstance(refused.value, TypeError) and isinstance(refused.value, BiasvizError)


def test_pick_gives_the_index_among_the_values_held() -> None:
    assert pick("layer", 2, [3, 0, 2, 1], "f.h5") == 2
    assert type(pick("layer", np.int64(1), range(4), "f.h5")) is int


def test_an_index_not_held_names_the_file_and_what_it_holds() -> None:
    with pytest.raises(ArgumentValueError) as refused:
        pick("layer", 5, [3, 1, 0, 2], "f.h5")
    assert str(refused.value) == "layer 5 is not in f.h5; it holds layers 0 to 3"
    assert isinstance(refused.value, ValueError) and isinstance(refused.value, BiasvizError)
    with pytest.raises(ArgumentValueError, match=r"^step 1 is not in run\.h5; it holds steps 0, 10, 20$"):
        pick("step", 1, [20, 0, 10], "run.h5")
    with pytest.raises(ArgumentValueError, match=r"^layer -1 is not in f\.h5; it holds layers 0 to 3$"):
        pick("layer", -1, range(4), "f.h5")  # no negative: -1 is just not there


def test_a_string_is_a_type_error_never_compared() -> None:
    """``"1"`` is refused as a string even where 1 is held: the message says what the file holds."""
    with pytest.raises(ArgumentTypeError) as refused:
        pick("step", "1", [0, 1, 2], "run.h5")
    assert str(refused.value) == "step must be an integer, not '1' (str); run.h5 holds steps 0 to 2"


def test_negative_counts_from_the_last() -> None:
    held = [4, 8, 6]
    assert pick("step", -1, held, "run.h5", negative=True) == 8
    assert pick("step", -3, held, "run.h5", negative=True) == 4
    assert pick("step", 6, held, "run.h5", negative=True) == 6
    with pytest.raises(ArgumentValueError) as refused:
        pick("step", -4, held, "run.h5", negative=True)
    assert str(refused.value) == "step -4 is not in run.h5; it holds steps 4, 6, 8, and -1 is the last"
    with pytest.raises(ArgumentValueError, match=r"^step -1 is not in run\.h5; it holds steps none$"):
        pick("step", -1, [], "run.h5", negative=True)  # nothing held: no last one to speak of


def test_described_says_what_the_values_are_instead() -> None:
    with pytest.raises(ArgumentValueError) as refused:
        pick("head", 0, range(1, 13), "f.h5", described="heads are numbered 1 to 12")
    assert str(refused.value) == "head 0 is not in f.h5; heads are numbered 1 to 12"
    with pytest.raises(ArgumentTypeError, match=r"not 1\.5 \(float\); heads are numbered 1 to 12$"):
        pick("head", 1.5, range(1, 13), "f.h5", described="heads are numbered 1 to 12")
