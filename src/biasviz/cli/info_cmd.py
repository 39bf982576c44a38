"""``biasviz info FILE.h5``: what a format-1 file holds and where it came from."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

import click

from biasviz.common.jsondoc import loads
from biasviz.common.terminal import inert
from biasviz.store.describe import dtype_name, summary


def layout(path: Path) -> dict[str, Any]:
    """``info --json``'s ``biasviz_layout``: what kind of file it is and the datasets it holds."""
    from biasviz.store import layer_group, open_bias_file

    with open_bias_file(path) as f:
        out: dict[str, Any] = {"summary": f.is_summary, "samples": f.n_samples, "bias_shared": f.bias_shared,
                               "bias_only": f.bias_only, "seq_len": f.seq_len, "n_heads": f.n_heads}  # fmt: skip
        if f.is_summary:
            out.update(resolution=f.resolution, block=f.block, blocks=f.summary.n_blocks)
        datasets = {}
        for layer in f.layers:
            group = layer_group(layer)
            if f.is_summary:
                held = {name: f.summary.h5[f"{group}/{name}"] for name in f.summary_datasets(layer)}
            else:  # as stored: a shared bias has one sample
                kinds = ["bias"] * f.has_bias(layer) + ["weights"] * (not f.bias_only)
                held = {k: getattr(f.dataset(k, layer), "stored", f.dataset(k, layer)) for k in kinds}
            for name, ds in held.items():
                datasets[f"{group}/{name}"] = {"shape": list(ds.shape), "dtype": dtype_name(ds)}
        out["datasets"] = datasets
    return out


def finite_json(value: object) -> object:
    """``value`` with every non-finite float as the text Python prints for it ("nan", "inf", "-inf"):
    JSON has no such numbers, and ``info --json`` must print what any JSON reader accepts."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print every root attribute as JSON instead.")
def info(file: str, as_json: bool) -> None:
    """Summarise a biasviz HDF5 file: scheme, model, shapes, layers, dtype and provenance."""
    from biasviz.common.errors import BiasvizError
    from biasviz.common.inputs import regular_file
    from biasviz.store import open_bias_file

    path = Path(file)
    if not path.exists():
        raise BiasvizError(f"{path} does not exist")
    regular_file(path, "biasviz .h5 file")
    if as_json:
        with open_bias_file(path, isolated=True) as f:
            attrs = f.attrs
        if isinstance(attrs.get("config_json"), str) and attrs["config_json"]:
            with contextlib.suppress(ValueError, RecursionError):  # plain JSON data; else keep the text as stored
                attrs["config_json"] = loads(attrs["config_json"], "the attribute config_json")
        attrs["biasviz_layout"] = layout(path)  # not an attribute: what the file holds, as the reader sees it
        click.echo(json.dumps(finite_json(attrs), indent=2, sort_keys=True, default=str, allow_nan=False))
        return
    click.echo(inert(summary(path), lines=True))  # the file's text shown as data, never as terminal controls
