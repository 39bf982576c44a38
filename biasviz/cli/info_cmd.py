"""``biasviz info FILE.h5``: what a format-1 file holds and where it came from."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import click

_SHOWN = {  # attributes the summary prints in its own lines; the rest go under "other"
    "biasviz_format", "scheme", "context_dependent", "context_dependent_known", "bias_convention", "source_model",
    "architecture",
    "model_sha256", "n_layers", "n_heads", "seq_len", "layers", "samples", "dtype", "device", "device_name",
    "seed", "text_source", "tokenizer", "created_utc", "biasviz_version", "torch_version", "config_json",
    "causal", "batch_size",
}  # fmt: skip


MAX_SHOWN = 200  # characters of one attribute shown; a file may hold huge strings


def _short(value: Any) -> str:
    """An attribute as one line of at most ``MAX_SHOWN`` characters (it is data from the file, shown as data)."""
    text = " ".join(str(value).split())
    return text if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN]}... ({len(text)} characters)"


def _filters(ds: Any) -> str:
    if ds.compression is None:
        return "uncompressed"
    level = f" level {ds.compression_opts}" if ds.compression_opts is not None else ""
    shuffle = " + shuffle" if ds.shuffle else ""
    return f"{ds.compression}{level}{shuffle}"


def summary(path: Path) -> str:
    """The human-readable summary ``biasviz info`` prints."""
    from biasviz.store import layer_group, open_bias_file

    with open_bias_file(path, isolated=True) as f:
        raw = f.attrs
        a = {k: _short(v) if isinstance(v, (str, list)) else v for k, v in raw.items()}  # one line each
        recorded = f.context_dependence_recorded
        kind = ("context dependence not recorded: a traced model; 'biasviz diagnose' measures it" if recorded is None
                else "context-dependent" if recorded else "context-independent")  # fmt: skip
        layers = f.layers
        n_layers = f.n_layers
        lines = [
            f"{path}  (biasviz format {a['biasviz_format']}, {path.stat().st_size / 1e6:.1f} MB)",
            f"  scheme          {f.scheme} ({kind}; bias convention: {a.get('bias_convention', 'relative')})",
            f"  model           {a['source_model']}",
            f"  architecture    {a['architecture']}, {n_layers} layers, {f.n_heads} heads",
            f"  model sha256    {a['model_sha256'] or '(unknown)'}",
            f"  layers          {', '.join(map(str, layers))} (of 0..{n_layers - 1})",
            f"  shape           {f.n_samples} samples x {f.n_heads} heads x {f.seq_len} queries x {f.seq_len} keys",
        ]
        if f.checkpoints is not None:
            steps = ", ".join(map(str, f.checkpoints))
            lines.append(f"  checkpoints     {len(f.checkpoints)} (training steps {steps}): a leading dimension "
                         "of bias and weights")  # fmt: skip
        for layer in layers:
            group = layer_group(layer)
            if not f.has_bias(layer):
                lines.append(f"  {group + '/bias':<16}absent (the scheme adds no bias)")
            names = ("bias", "weights") if f.has_bias(layer) else ("weights",)
            for name in ("bias",) if f.bias_only else names:
                ds = f.dataset(name, layer)
                chunks = "x".join(map(str, ds.chunks)) if ds.chunks else "none"
                lines.append(f"  {group + '/' + name:<16}{ds.dtype}, {_filters(ds)}, chunks {chunks}")
        masked = "causal (cells after the query: bias NaN, weights 0)" if f.causal else "bidirectional (no mask)"
        lines += [
            f"  mask            {masked}",
            f"  stored as       {a['dtype']}",
            f"  inputs          {a['text_source']}; seed {a['seed']}; tokenizer {a.get('tokenizer', '(not recorded)')}",
            f"  device          {a['device']}" + (f" ({a['device_name']})" if a.get("device_name") else "")
            + (f", batch size {a['batch_size']}" if "batch_size" in a else ""),
            f"  created         {a['created_utc']} with biasviz {a['biasviz_version']}, torch {a['torch_version']}",
        ]  # fmt: skip
        other = {k: v for k, v in raw.items() if k not in _SHOWN}
        for k in sorted(other):
            lines.append(f"  {_short(k):<15} {_short(other[k])}")
        if a.get("config_json"):
            lines.append(f"  {'config':<16}stored as JSON (biasviz info --json shows it)")
    return "\n".join(lines)


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
                attrs["config_json"] = json.loads(attrs["config_json"])
        click.echo(json.dumps(attrs, indent=2, sort_keys=True, default=str))
        return
    click.echo(summary(path))
