"""A file's datasets with their names on: each dimension's label and coordinates from the file's HDF5 dimension
scales (or, where a file labels none, from docs/hdf5.md and the table of datasets), and a layer as an
``xarray.Dataset`` (:meth:`biasviz.store.view.FileView.to_xarray`).

Only labels and scales are read here; the values come through the view, as the reader reads and checks them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from biasviz.common.errors import BiasvizError
from biasviz.store import datasets
from biasviz.store import format as fmt
from biasviz.store.datasets import ROWS
from biasviz.store.reader import BiasFile

MATRICES = ("bias", "weights", "scores")  # a full file's (sample, head, query, key) datasets
XARRAY_EXTRA = "pip install 'biasviz[xarray]'"

Dims = list[tuple[str, np.ndarray | None]]


def dims(f: BiasFile, name: str) -> Dims:
    """``(label, coordinate values or None)`` of each dimension of the dataset ``name`` of ``f``, from its HDF5
    dimension scales; a scale with a ``names`` attribute (``stat``) gives those names."""
    ds = f._h5[name]  # the reader's open file: only the labels and scales are read here
    out = []
    named = layout_dims(name.rpartition("/")[2])
    named = ("checkpoint", *named) if len(named) == ds.ndim - 1 else named
    for k, dim in enumerate(ds.dims):
        label = dim.label or (named[k] if len(named) == ds.ndim else f"dim_{k}")
        coord = None
        if len(dim):
            scale = dim[0]
            names = scale.attrs.get("names")
            coord = np.asarray(names.split(",")) if isinstance(names, str) else np.asarray(scale[()])
        out.append((label, coord))
    return out


def layout_dims(name: str) -> tuple[str, ...]:
    """The dimensions docs/hdf5.md, 'Full files' gives a full file's dataset, and the table of datasets a summary
    layer's, for files that do not label their own."""
    if name in MATRICES:
        return fmt.DIMS
    if name in ROWS:
        return ROWS[name].dims
    return ("sample", "query") if name == "input_ids" else ()


def to_xarray(view: Any, layer: int | None) -> Any:
    """``view``'s ``layer`` (an index it holds; None: every layer, along a ``layer`` dimension) and ``input_ids`` as an
    ``xarray.Dataset``, with the file's root attributes."""
    try:
        import xarray as xr
    except ImportError:
        raise BiasvizError(f"to_xarray needs xarray, an optional extra of biasviz: {XARRAY_EXTRA}") from None
    if layer is None:
        parts = [_layer_dataset(xr, view, one) for one in view.layers]
        data = xr.concat(parts, dim="layer").assign_coords(layer=view.layers)
    else:
        data = _layer_dataset(xr, view, layer)
    data["input_ids"] = _labelled(xr, view["input_ids"], view.dims("input_ids"))
    data.attrs.update(view.attrs)
    return data


def _layer_dataset(xr: Any, view: Any, layer: int) -> Any:
    """One layer's datasets as variables: records (the diagnostics, ``sink_keys``) one variable per field; the
    distance bins' first and last distance, which rows of ``frequency_use`` are rotary pairs and the queries a sink key
    must be seen by, as the file says them."""
    variables = {}
    held = [key for key in view.keys() if key.partition("/")[0] == fmt.layer_group(layer)]  # noqa: SIM118 (a view)
    for key in held:
        name = key.partition("/")[2]
        values, labels = view[key], view.dims(key)
        if values.dtype.names:
            for field in values.dtype.names:
                variables[f"{name}_{field}"] = _labelled(xr, values[field], labels)
        else:
            variables[name] = _labelled(xr, values, labels)
    data = xr.Dataset(variables)
    summary = view._f.summary
    if "distance_bin" in data.dims:  # docs/position-measures.md's bins: the first and last distance of each
        bins = summary.distance_bins()
        data = data.assign_coords(distance_first=("distance_bin", bins[:, 0]),
                                  distance_last=("distance_bin", bins[:, 1]))  # fmt: skip
    said = summary.rotary_pairs(layer) if datasets.FREQUENCY_USE in data else None
    if said is not None:  # which rows of frequency_use are rotary pairs (False: the unrotated dims together)
        data = data.assign_coords(rotary=("pair", np.arange(data.sizes["pair"]) < said[0]))
        data[datasets.FREQUENCY_USE].attrs.update(rotary_pairs=said[0], rotary_layout=said[1])
    least = summary.sink_min_queries(layer) if f"{datasets.SINK_KEYS}_index" in data else None
    if least is not None:  # the queries a key must be seen by to rank (docs/position-measures.md, 'Sink keys')
        data = data.assign(sink_min_queries=(("sample", "head"), np.asarray(least)))
    return data


def _labelled(xr: Any, values: np.ndarray, labels: Dims) -> Any:
    """``values`` as a DataArray named by ``labels``, with each scale that fits its axis as the coordinate."""
    coords = {d: c for (d, c), n in zip(labels, values.shape, strict=True) if c is not None and len(c) == n}
    return xr.DataArray(values, dims=[d for d, _ in labels], coords=coords)


__all__ = ["MATRICES", "XARRAY_EXTRA", "dims", "layout_dims", "to_xarray"]
