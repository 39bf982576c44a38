"""Settings read from the environment are checked as options are (:mod:`biasviz.common.settings`): unset or empty
is ``auto``, case and surrounding blanks do not matter, and a value biasviz does not know is one error that quotes
it and lists the values it takes, never silently ``auto``."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

import pytest

from biasviz.common import settings
from biasviz.common.errors import BiasvizError

# (variable, reader, the values it takes): written out here, not read from the module
MODES: list[tuple[str, Callable[[], str], tuple[str, ...]]] = [
    ("BIASVIZ_ATTENTION", settings.attention_mode, ("auto", "flex", "table", "sdpa")),
    ("BIASVIZ_STATISTICS", settings.statistics_mode, ("auto", "fused", "torch")),
    ("BIASVIZ_PROGRESS", settings.progress_mode, ("auto", "bar", "lines")),
]
IDS = [variable for variable, _, _ in MODES]


@pytest.mark.parametrize(("variable", "read", "values"), MODES, ids=IDS)
def test_unset_or_blank_is_auto(variable: str, read: Callable[[], str], values: tuple[str, ...],
                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.delenv(variable, raising=False)
    assert read() == "auto"
    for blank in ("", "   ", "\t"):
        monkeypatch.setenv(variable, blank)
        assert read() == "auto"


@pytest.mark.parametrize(("variable", "read", "values"), MODES, ids=IDS)
def test_every_value_is_read_whatever_its_case_and_blanks(variable: str, read: Callable[[], str],
                                                          values: tuple[str, ...],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    for value in values:
        for spelled in (value, value.upper(), f"  {value.title()}\n"):
            monkeypatch.setenv(variable, spelled)
            assert read() == value


@pytest.mark.parametrize(("variable", "read", "values"), MODES, ids=IDS)
def test_an_unknown_value_is_one_error_quoting_it(variable: str, read: Callable[[], str], values: tuple[str, ...],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    for typo in ("garbage", "Fast", "auto2", "a uto"):
        monkeypatch.setenv(variable, typo)
        with pytest.raises(BiasvizError) as refused:
            read()
        assert str(refused.value).startswith(f"{variable}={typo!r} is not one of {', '.join(values)}")
        assert "(unset means auto)" in str(refused.value)


@pytest.mark.parametrize(("text", "want"), [
    ("", ""), ("  figures/alibi_bias.pdf  ", "figures/alibi_bias.pdf"), ("a\x1b[2Jb", "a?[2Jb"),
    ("tab\there", "tab?here"), ("x" * 100, "x" * 80), ("é 名前", "é 名前"),
])  # fmt: skip
def test_the_progress_label_is_printable_and_at_most_80_characters(text: str, want: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BIASVIZ_PROGRESS_FOR", text)
    assert settings.progress_label() == want


def test_no_progress_label_where_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BIASVIZ_PROGRESS_FOR", raising=False)
    assert settings.progress_label() == ""


def test_a_backend_matplotlib_refuses_is_one_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib refuses an unknown MPLBACKEND with a ValueError as it is imported (imitated here, so the test
    needs no fresh process): the error quotes the value and keeps matplotlib's first clause."""
    real_import = builtins.__import__

    def refusing(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib":
            raise ValueError("'garbage' is not a valid value for backend; supported values are ['agg']")
        return real_import(name, *args, **kwargs)

    monkeypatch.setenv("MPLBACKEND", "garbage")
    monkeypatch.setattr(builtins, "__import__", refusing)
    with pytest.raises(BiasvizError) as refused:
        settings.check_plot_backend()
    assert str(refused.value) == ("MPLBACKEND='garbage' is not a matplotlib backend; unset it or set it to a valid "
                                  "one such as agg ('garbage' is not a valid value for backend)")  # fmt: skip


@pytest.mark.parametrize("value", [None, "", "  "])
def test_an_unset_or_blank_backend_is_not_checked(value: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing to check: matplotlib is not even imported for it."""

    def no_import(name: str, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"imported {name}")

    if value is None:
        monkeypatch.delenv("MPLBACKEND", raising=False)
    else:
        monkeypatch.setenv("MPLBACKEND", value)
    monkeypatch.setattr(builtins, "__import__", no_import)
    settings.check_plot_backend()
