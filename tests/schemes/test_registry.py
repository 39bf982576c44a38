"""The table of schemes (:mod:`biasviz.schemes.registry`): every scheme of the spec, its names and aliases, the
classes it names, readable without torch."""

from __future__ import annotations

import pytest

from biasviz.common.errors import BiasvizError
from biasviz.schemes import SCHEMES, all_names, canonical_name, get_scheme
from tests.schemes.scheme_biases import H


def test_registry_holds_every_scheme_of_the_spec() -> None:
    assert list(SCHEMES) == ["alibi", "kerple-log", "kerple-power", "fire", "t5", "cable", "fox", "rope", "learned",
                             "nope"]  # fmt: skip
    assert canonical_name("kerple") == "kerple-log"
    assert canonical_name("T5-Bias") == "t5"
    assert set(all_names()) >= {"kerple", "t5-bias"}
    assert [n for n, c in SCHEMES.items() if c.context_dependent] == ["cable", "fox"]
    assert [n for n, c in SCHEMES.items() if not c.adds_bias] == ["rope", "learned", "nope"]
    assert [n for n, c in SCHEMES.items() if c.rotary] == ["rope"]


def test_unknown_scheme_lists_the_valid_ones() -> None:
    with pytest.raises(BiasvizError, match="valid schemes: .*alibi.*t5-bias"):
        canonical_name("xpos")


def test_the_table_and_the_classes_agree() -> None:
    """Each table entry names a class that exists, calls itself by that name, and carries the entry's facts."""
    from biasviz.schemes.registry import TABLE

    for entry in TABLE:
        cls = get_scheme(entry.name)
        assert cls.__name__ == entry.cls and cls.name == entry.name
        assert (cls.aliases, cls.formula, cls.reference) == (entry.aliases, entry.formula, entry.reference)
        flags = ("context_dependent", "adds_bias", "absolute_positions")
        assert [getattr(cls, f) for f in flags] == [getattr(entry, f) for f in flags]
        module = cls(H, 48)
        assert module.options == entry.default_options  # the options the class accepts are the table's
        for alias in entry.aliases:
            assert get_scheme(alias) is cls


def test_the_table_is_readable_without_torch() -> None:
    import subprocess
    import sys

    code = ("import sys; from biasviz.schemes import TABLE, canonical_name, info; "
            "assert canonical_name('kerple') == 'kerple-log' and info('cable').context_dependent; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
