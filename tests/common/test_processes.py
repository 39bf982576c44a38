"""This process's place among torchrun's (:mod:`biasviz.common.processes`): the environment torchrun sets read and
checked, each rank's contiguous share of the items, and the collectives, which do nothing in one process and agree
across two real ones (gloo)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from biasviz.common.errors import BiasvizError
from biasviz.common.processes import World, all_true, from_main, process_group, rank_device, world

RENDEZVOUS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def plain(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment without torchrun's variables."""
    for name in RENDEZVOUS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_one_process_is_rank_0_of_1_and_the_main_one() -> None:
    assert World() == World(rank=0, size=1, local_rank=0) and World().main
    assert not World(rank=1, size=2).main
    with pytest.raises(dataclasses.FrozenInstanceError):
        World().rank = 1  # type: ignore[misc]


def test_blocks_are_worked_out_by_hand() -> None:
    """10 items on 3 ranks: bounds round(0, 3.33, 6.67, 10) = 0, 3, 7, 10; 2 items on 4: round(0, 0.5, 1, 1.5, 2)
    = 0, 0, 1, 2, 2 (halves to even, as numpy rounds)."""
    assert [World(r, 3).block(10) for r in range(3)] == [slice(0, 3), slice(3, 7), slice(7, 10)]
    assert [World(r, 4).block(2) for r in range(4)] == [slice(0, 0), slice(0, 1), slice(1, 2), slice(2, 2)]
    assert World().block(5) == slice(0, 5)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_blocks_cover_the_items_in_order_and_differ_by_at_most_one(size: int) -> None:
    for n in range(30):
        shares = [World(r, size).block(n) for r in range(size)]
        assert [i for s in shares for i in range(n)[s]] == list(range(n))
        lengths = [s.stop - s.start for s in shares]
        assert max(lengths) - min(lengths) <= 1 and all(type(s.start) is int for s in shares)


def test_world_reads_torchruns_environment(plain: pytest.MonkeyPatch) -> None:
    assert world() == World(0, 1, 0)
    plain.setenv("WORLD_SIZE", "4")
    plain.setenv("RANK", "2")
    assert world() == World(2, 4, 2)  # no LOCAL_RANK: the rank (one node)
    plain.setenv("LOCAL_RANK", "0")
    assert world() == World(2, 4, 0)


@pytest.mark.parametrize(("env", "message"), [
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE, RANK and LOCAL_RANK must be integers (as torchrun sets them)"),
    ({"RANK": "1.0"}, "WORLD_SIZE, RANK and LOCAL_RANK must be integers (as torchrun sets them)"),
    ({"WORLD_SIZE": "4", "RANK": "4"}, "RANK=4, LOCAL_RANK=4 and WORLD_SIZE=4 do not fit together"),
    ({"WORLD_SIZE": "0", "RANK": "0"}, "RANK=0, LOCAL_RANK=0 and WORLD_SIZE=0 do not fit together"),
    ({"WORLD_SIZE": "2", "RANK": "-1", "LOCAL_RANK": "0"}, "RANK=-1, LOCAL_RANK=0 and WORLD_SIZE=2 do not fit"),
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "-1"}, "RANK=1, LOCAL_RANK=-1 and WORLD_SIZE=2 do not fit"),
])  # fmt: skip
def test_a_world_that_does_not_add_up_is_refused(plain: pytest.MonkeyPatch, env: dict[str, str], message: str) -> None:
    for name, value in env.items():
        plain.setenv(name, value)
    with pytest.raises(BiasvizError) as refused:
        world()
    assert str(refused.value).startswith(message)


def test_one_process_joins_nothing_and_the_collectives_give_its_own_values(plain: pytest.MonkeyPatch) -> None:
    with process_group("cpu") as (w, device):
        assert w == World() and device == torch.device("cpu") and not dist.is_initialized()
        assert all_true(True) is True and all_true(False) is False
        box = {"a": [1]}
        assert from_main(box) is box
    assert rank_device("cpu", World(1, 2, 1)) == torch.device("cpu")  # no CUDA: no GPU of its own to pick


def test_a_process_without_a_rendezvous_says_to_start_with_torchrun(plain: pytest.MonkeyPatch) -> None:
    plain.setenv("WORLD_SIZE", "2")
    plain.setenv("RANK", "0")
    with pytest.raises(BiasvizError, match=r"^process 0 of 2 cannot join the others \(.*MASTER_ADDR.*\); start the "
                                           r"processes with torchrun$"), process_group("cpu"):
        pass
    assert not dist.is_initialized()


def test_the_collectives_combine_this_processs_value_with_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of 2, the other process's answers stood in for: a flag is true everywhere only where both are
    (all_reduce by the op asked for, applied to both values), and process 0's value replaces this one's."""
    others_flag = [1]
    reduce = {dist.ReduceOp.MIN: min, dist.ReduceOp.MAX: max, dist.ReduceOp.SUM: sum}

    def all_reduce(t: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> None:
        t.fill_(reduce[op]([int(t.item()), others_flag[0]]))

    def broadcast_object_list(box: list[object], src: int = 0) -> None:
        assert src == 0
        box[0] = "process 0's value"

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "broadcast_object_list", broadcast_object_list)
    assert all_true(True) is True and all_true(False) is False
    others_flag[0] = 0
    assert all_true(True) is False and all_true(False) is False
    assert from_main("rank 1's value") == "process 0's value"


def test_the_collectives_go_through_a_joined_group(tmp_path: Path) -> None:
    """A group of one process joined here (gloo): each helper takes the collective's path, and gives its own values."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert all_true(True) is True and all_true(False) is False
        assert from_main({"a": [1]}) == {"a": [1]}
    finally:
        dist.destroy_process_group()
