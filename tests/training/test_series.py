"""Checkpoint series (:mod:`biasviz.training.series`): the names that carry a step (and the tokens seen),
``--step-pattern``, the order of a folder of checkpoints, ``log:N`` against steps worked out by hand, and what
``--checkpoints`` picks."""

from __future__ import annotations

from pathlib import Path

import pytest

from biasviz.common.errors import BiasvizError, UsageError
from biasviz.training.series import (
    STEP_PATTERNS,
    Checkpoint,
    folder_series,
    log_spaced,
    ordered,
    parse_name,
    parse_tokens,
    pick,
    step_regex,
)

PYTHIA_STEPS = [0, *[2**k for k in range(10)], *range(1000, 143001, 1000)]  # Pythia's 154 revisions


# --- names and log:N -----------------------------------------------------------------------------------------
def test_the_table_parses_its_own_examples_and_nothing_else() -> None:
    expected = {"checkpoint-1000": (1000, None), "global_step1000": (1000, None), "iter_0001000": (1000, None),
                "step_1000": (1000, None), "stage1-step1000-tokens4B": (1000, 4 * 10**9),
                "step1000": (1000, None)}  # fmt: skip
    assert {example: parse_name(example) for _, example, _ in STEP_PATTERNS} == expected
    assert parse_name("step1000-tokens4194B") == (1000, 4194 * 10**9)  # OLMo-7B's names have no stage
    for other in ("main", "checkpoint-final", "step-1000", "global_step", "v1.0", "stage1-step1000"):
        assert parse_name(other) is None, other


def test_log_spaced_picks_the_hand_computed_steps() -> None:
    # Pythia, log:10: step0, then 9 targets 1 * 143000^(k/8) = 1, 4.41, 19.5, 85.8, 378, 1669, 7363, 32477, 143000,
    # each the nearest present step in log: 1, 4, 16, 64, 512 (378: |ln 512/378| = 0.30 < |ln 378/256| = 0.39),
    # 2000, 7000, 32000, 143000
    assert log_spaced(PYTHIA_STEPS, 10) == [0, 1, 4, 16, 64, 512, 2000, 7000, 32000, 143000]
    # log:3 of Pythia: 0, then targets 1 and 143000 only
    assert log_spaced(PYTHIA_STEPS, 3) == [0, 1, 143000]
    # no step 0: targets 10, 100, 1000 over 10..1000; a cluster at the low end still gives N distinct steps
    assert log_spaced([10, 20, 30, 100, 1000], 3) == [10, 100, 1000]
    assert log_spaced([1, 2, 3, 1000], 3) == [1, 3, 1000]  # target 31.6: 3 (ln 10.5) beats 1000 (ln 31.6)
    assert log_spaced([5, 6], 9) == [5, 6] and log_spaced([5, 6, 7], 1) == [7]


def test_the_sweeps_page_shows_the_table_the_code_uses() -> None:
    from biasviz.training.series import pattern_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "sweeps.md").read_text(encoding="utf-8")
    assert pattern_table() in page


# --- token counts and --step-pattern -------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "count"), [
    ("7", 7), ("0", 0), ("12K", 12_000), ("3M", 3_000_000), ("4B", 4_000_000_000), ("2T", 2 * 10**12),
    (" 5K ", 5_000),
])  # fmt: skip
def test_a_token_count_is_digits_times_its_unit(text: str, count: int) -> None:
    assert parse_tokens(text) == count


@pytest.mark.parametrize("text", ["", "4b", "4.5B", "B", "4BB", "-4", "4 B"])
def test_a_token_count_in_another_form_is_refused(text: str) -> None:
    with pytest.raises(BiasvizError, match="cannot read a token count"):
        parse_tokens(text)


def test_a_step_pattern_is_the_only_one_asked() -> None:
    regex = step_regex(r"ckpt-e\d+-s(?P<step>\d+)(?:-t(?P<tokens>\d+[KMBT]?))?")
    assert parse_name("ckpt-e3-s600", regex) == (600, None)
    assert parse_name("ckpt-e3-s600-t2M", regex) == (600, 2_000_000)
    assert parse_name("checkpoint-600", regex) is None  # the table is not asked beside it
    assert parse_name("xckpt-e3-s600", regex) is None  # the whole name must match
    assert step_regex(None) is None
    with pytest.raises(UsageError, match="no named group 'step'"):
        step_regex(r"ckpt-(\d+)")
    with pytest.raises(UsageError, match="not a regular expression"):
        step_regex(r"ckpt-(?P<step>\d+")


# --- the order of a series ----------------------------------------------------------------------------------------
def test_a_folder_series_is_its_checkpoint_folders_by_step_as_numbers(tmp_path: Path) -> None:
    for name in ("checkpoint-100", "checkpoint-20", "checkpoint-3", "checkpoint-7", "notes"):
        (tmp_path / name).mkdir()
    for name in ("checkpoint-100", "checkpoint-20", "checkpoint-3", "notes"):  # checkpoint-7 holds no config.json
        (tmp_path / name / "config.json").write_text("{}")
    (tmp_path / "checkpoint-9").write_text("a file, not a folder")
    series = folder_series(tmp_path)
    assert [(c.step, c.name, c.path, c.tokens) for c in series] == [
        (3, "checkpoint-3", tmp_path / "checkpoint-3", None),
        (20, "checkpoint-20", tmp_path / "checkpoint-20", None),
        (100, "checkpoint-100", tmp_path / "checkpoint-100", None),
    ]  # fmt: skip
    assert folder_series(tmp_path / "absent") == []


def test_two_names_for_one_step_are_refused() -> None:
    found = [Checkpoint(1000, "step1000", None), Checkpoint(5, "step_5", None), Checkpoint(1000, "step_1000", None)]
    with pytest.raises(BiasvizError, match="'step1000' and 'step_1000' are both step 1000"):
        ordered(found, "run")
    assert [c.step for c in ordered(found[:2], "run")] == [5, 1000]


# --- log:N ---------------------------------------------------------------------------------------------------------
def test_log_spaced_steps_on_exact_powers() -> None:
    # every step 1..1000: targets 1000^(k/3) = 1, 10, 100, 1000, each present
    assert log_spaced(range(1, 1001), 4) == [1, 10, 100, 1000]
    # step 0 counts as one of the N, the other four spread over 1..1000 as above
    assert log_spaced(range(0, 1001), 5) == [0, 1, 10, 100, 1000]
    # powers of two up to 2^10: targets 1024^(k/5) = 4^k
    assert log_spaced([2**k for k in range(11)], 6) == [1, 4, 16, 64, 256, 1024]
    # unsorted, repeated steps are taken once each
    assert log_spaced([1000, 10, 1, 100, 10, 1], 4) == [1, 10, 100, 1000]


@pytest.mark.parametrize("n", [0, -3])
def test_log_of_fewer_than_one_checkpoint_is_refused(n: int) -> None:
    with pytest.raises(UsageError, match="at least 1"):
        log_spaced([1, 2, 3], n)


# --- --checkpoints --------------------------------------------------------------------------------------------------
PRESENT = [Checkpoint(s, f"checkpoint-{s}", Path(f"/runs/checkpoint-{s}")) for s in (0, 10, 100, 1000)]


@pytest.mark.parametrize(("spec", "steps"), [
    ("all", [0, 10, 100, 1000]), ("ALL", [0, 10, 100, 1000]), ("first", [0]), ("last", [1000]),
    ("last, first", [0, 1000]), ("10,checkpoint-100", [10, 100]), ("100,100,checkpoint-100", [100]),
    ("log:2", [0, 1000]), ("log:3", [0, 10, 1000]), ("first,log:1", [0, 1000]), (" 10 ,, ", [10]),
])  # fmt: skip
def test_checkpoints_picks_by_step_name_and_keyword(spec: str, steps: list[int]) -> None:
    got = pick(spec, PRESENT, "/runs")
    assert [c.step for c in got] == steps
    assert all(c in PRESENT for c in got)


@pytest.mark.parametrize(("spec", "message"), [
    ("55", "'55' is not all, first, last or one of the steps 0, 10, 100, 1000"),
    ("checkpoint-55", "'checkpoint-55' is not all"),
    ("log:x", "should be log:N"),
    ("log:0", "at least 1"),
    (",", "--checkpoints is empty"),
])  # fmt: skip
def test_checkpoints_that_name_nothing_present_are_usage_errors(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        pick(spec, PRESENT, "/runs")


def test_an_item_not_on_disk_gets_the_callers_error() -> None:
    def missing(item: str) -> BiasvizError:
        return BiasvizError(f"revision {item} is not in the cache")

    with pytest.raises(BiasvizError, match="revision step5 is not in the cache"):
        pick("first,step5", PRESENT, "/runs", missing)
    with pytest.raises(BiasvizError, match="revision step5 is not in the cache"):
        pick("all,step5", [], "/runs", missing)  # nothing present: the first explicit item is the one missing
    with pytest.raises(BiasvizError, match="/runs holds no checkpoints whose names give a step"):
        pick("all", [], "/runs", missing)
    with pytest.raises(BiasvizError, match="holds no checkpoints"):
        pick("10", [], "/runs")
