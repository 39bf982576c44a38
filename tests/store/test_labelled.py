"""A file's datasets with their names on (:mod:`biasviz.store.labelled`): the labels a file gives its dimensions, and
where it gives none, the ones docs/hdf5.md and the table of datasets give (a sweep's checkpoint axis first). Files are
written with h5py (tests/summary_files.py), so the labels are held to the layout, not to biasviz's writer; what a view
makes of them (``to_xarray``) is tested in test_view.py."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from biasviz.store import open_bias_file
from biasviz.store.labelled import dims, layout_dims
from tests.summary_files import alibi, cable, weights_of, write_full, write_summary


def test_the_layout_gives_each_dataset_its_dimensions() -> None:
    assert layout_dims("weights") == layout_dims("bias") == ("sample", "head", "query", "key")
    assert layout_dims("band_mass") == ("stat", "head", "distance_bin")
    assert layout_dims("sink_share") == ("sample", "head")
    assert layout_dims("input_ids") == ("sample", "query")
    assert layout_dims("something_else") == ()


def test_labels_the_file_gives_are_read_and_the_layouts_stand_in_where_it_gives_none(tmp_path: Path) -> None:
    bias = alibi(2, 4, 8)
    path = write_full(tmp_path / "f.h5", "alibi", bias, weights_of(bias), layer=1)
    with h5py.File(path, "a") as f:
        f["layer_1/bias"].dims[2].label = "row"  # the file's own word
        f["layer_1/weights"].dims[0].label = ""  # none: the layout's
        f.create_dataset("head", data=np.arange(1, 5))
        f["head"].make_scale("head")
        f["layer_1/weights"].dims[1].attach_scale(f["head"])
    with open_bias_file(path) as f:
        assert [label for label, _ in dims(f, "layer_1/bias")] == ["sample", "head", "row", "key"]
        got = dims(f, "layer_1/weights")
        assert [label for label, _ in got] == ["sample", "head", "query", "key"]
        np.testing.assert_array_equal(got[1][1], [1, 2, 3, 4])  # the scale is the head's coordinate
        assert got[0][1] is None


def test_a_sweeps_unlabelled_axis_is_its_checkpoint(tmp_path: Path) -> None:
    data = cable(3, 4, 12)
    path = write_summary(tmp_path / "s.h5", bias=data, weights=weights_of(data), resolution=4, steps=[0, 10])
    with h5py.File(path, "a") as f:
        for k in range(4):
            f["layer_3/bias_mean"].dims[k].label = ""
    with open_bias_file(path) as f:
        assert [label for label, _ in dims(f, "layer_3/bias_mean")] == ["checkpoint", "head", "query_block",
                                                                        "key_block"]  # fmt: skip
