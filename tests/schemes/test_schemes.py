"""The package's own code (:mod:`biasviz.schemes`): :func:`register` giving a class its table entry's facts and refusing
a class that is not the one the entry names, the name -> class mapping in the table's order, and names by alias."""

from __future__ import annotations

import pytest

import biasviz.schemes as schemes
from biasviz.schemes import SCHEMES, TABLE, get_scheme, register


def test_register_gives_a_class_its_entrys_facts_and_place() -> None:
    entry = TABLE[3]

    class Made:  # a stand-in named as the entry names its class
        name = entry.name

    Made.__name__ = entry.cls
    assert register(Made) is Made
    assert Made.order == 3 and Made.formula == entry.formula and Made.reference == entry.reference
    assert Made.default_options == dict(entry.default_options) and Made.default_options is not entry.default_options
    assert (Made.context_dependent, Made.adds_bias, Made.rotary) == (entry.context_dependent, entry.adds_bias,
                                                                   entry.rotary)  # fmt: skip


def test_register_refuses_a_class_the_entry_does_not_name() -> None:
    class Impostor:
        name = TABLE[0].name

    with pytest.raises(ValueError, match=f"scheme class Impostor does not match the table entry for '{TABLE[0].name}'"):
        register(Impostor)


def test_schemes_map_names_to_classes_in_the_tables_order() -> None:
    assert list(SCHEMES) == [entry.name for entry in TABLE] and len(SCHEMES) == len(TABLE)
    for entry in TABLE:
        assert SCHEMES[entry.name].__name__ == entry.cls
        for alias in entry.aliases:
            assert get_scheme(alias) is SCHEMES[entry.name]
    with pytest.raises(KeyError):
        SCHEMES["xpos"]


def test_the_base_class_is_there_when_asked_for() -> None:
    from biasviz.schemes.base import PositionScheme

    assert schemes.PositionScheme is PositionScheme
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        _ = schemes.Nothing
