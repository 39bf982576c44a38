"""Attribute values as HDF5 stores them (:func:`biasviz.store.h5io.attr_value`): a dict becomes JSON text, a type
that cannot be stored is refused before any file is made."""

from __future__ import annotations

import pytest

from biasviz.store import BiasFileWriter
from tests.store.small_files import H, T, _attrs


def test_dict_attributes_become_json_and_unknown_types_are_refused(tmp_path):
    writer = BiasFileWriter(tmp_path / "a.h5", attrs={**_attrs(), "extra": {"b": 1}}, n_samples=1, n_heads=H,
                            seq_len=T, layers=[0], has_bias=False)  # fmt: skip
    with pytest.raises(ValueError), writer:
        raise ValueError("stop early")
    bad = BiasFileWriter(tmp_path / "b.h5", attrs={**_attrs(), "bad": object()}, n_samples=1, n_heads=H,
                         seq_len=T, layers=[0], has_bias=False)  # fmt: skip
    with pytest.raises(TypeError, match="cannot store"):
        bad.__enter__()
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind either
