"""The text ``biasviz info`` prints of a file (and ``repr`` of ``biasviz.open``'s view shows): what it holds and
where it came from, every value read from the file shown as data."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

_SHOWN = {  # attributes the summary prints in its own lines; the rest go under "other"
    "biasviz_format", "scheme", "context_dependent", "context_dependent_known", "bias_convention", "source_model",
    "architecture",
    "model_sha256", "n_layers", "n_heads", "seq_len", "layers", "samples", "dtype", "device", "device_name",
    "seed", "text_source", "tokenizer", "created_utc", "biasviz_version", "torch_version", "config_json",
    "causal", "mask", "batch_size", "summary", "resolution", "block", "bias_shared", "checkpoints_left_out",
    "checkpoints_identical", "call_modules",
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
            *_call_lines(raw, layers, n_layers),
            *_shape_lines(f),
        ]
        if f.checkpoints is not None:
            steps = ", ".join(map(str, f.checkpoints))
            lines.append(f"  checkpoints     {len(f.checkpoints)} (training steps {steps}): a leading dimension "
                         f"of {'every layer dataset' if f.is_summary else 'bias and weights'}")  # fmt: skip
            lines += _sweep_notes(raw)
        for layer in layers:
            lines += _layer_lines(f, layer, layer_group(layer))
        masked = "causal (cells after the query: bias NaN, weights 0)" if f.causal else "bidirectional (no mask)"
        own = [layer for layer in layers if f.layer_causal(layer) != f.causal]  # an encoder-decoder's calls differ
        if own:
            rule = "causal (bias NaN, weights 0 past the query)" if not f.causal else "bidirectional (every cell)"
            masked = f"{masked}; layers {', '.join(map(str, own))}: {rule}"
        if raw.get("mask") == "model":  # docs/hdf5.md, 'Attended cells': some layer's call had a mask of its own
            masked = ("the model's own in some layers (each such layer's attended share stored; cells no sample "
                      f"attends: NaN); elsewhere {masked}")  # fmt: skip
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


def _sweep_notes(raw: dict[str, Any]) -> list[str]:
    """A sweep's checkpoints left out (and why) and those with byte-identical weights, as recorded (JSON text);
    a value that is not what extract writes is shown as it is, never trusted."""
    from biasviz.store.h5io import json_attr

    lines = []
    for key, label in (("checkpoints_left_out", "left out"), ("checkpoints_identical", "identical")):
        if key not in raw:
            continue
        value = json_attr(raw[key])
        if key == "checkpoints_left_out" and isinstance(value, dict):
            text = "; ".join(f"{_short(str(k))}: {_short(str(v))}" for k, v in value.items())
        elif key == "checkpoints_identical" and isinstance(value, list) and all(isinstance(g, list) for g in value):
            text = "; ".join(" = ".join(_short(str(n)) for n in g) for g in value) + " (byte-identical weights)"
        else:
            text = _short(raw[key])
        lines.append(f"  {label:<15} {_short(text)}")
    return lines


def _call_lines(raw: dict[str, Any], layers: list[int], n_layers: int) -> list[str]:
    """A traced model's layers are its attention calls: the module that made each of the file's, as recorded (JSON
    text, :data:`~biasviz.store.format.CALL_MODULES`); a value that is not what extract writes is shown as it is."""
    from biasviz.store.format import CALL_MODULES
    from biasviz.store.h5io import call_modules

    if CALL_MODULES not in raw:
        return []
    owners = call_modules(raw[CALL_MODULES], n_layers)
    if owners is None:
        return [f"  made by         {_short(raw[CALL_MODULES])} (not a list of {n_layers} module names)"]
    return [f"  made by         {_short(_grouped([_short(o) for o in owners], layers))} (a layer is an attention "
            "call, in the order the model makes them)"]  # fmt: skip


def _grouped(owners: Sequence[str], layers: Sequence[int]) -> str:
    """``layers`` by the module that made each call, runs of one module together: how ``biasviz info`` says it.

    >>> _grouped(["layers.0.attn", "layers.0.attn", "layers.1.attn"], [0, 1, 2])
    '0, 1: layers.0.attn; 2: layers.1.attn'
    """
    runs: list[tuple[str, list[int]]] = []
    for layer in layers:
        owner = owners[layer] or "the model's own forward"
        if runs and runs[-1][0] == owner:
            runs[-1][1].append(layer)
        else:
            runs.append((owner, [layer]))
    return "; ".join(f"{', '.join(map(str, at))}: {owner}" for owner, at in runs)


def _shape_lines(f: Any) -> list[str]:
    """What the file holds: every sample's matrices, or a summary of them (docs/hdf5.md, 'Summary files')."""
    n, h, t = f.n_samples, f.n_heads, f.seq_len
    if not f.is_summary:
        return [f"  shape           {n} samples x {h} heads x {t} queries x {t} keys"]
    nb = f.summary.n_blocks
    over = "from the scheme's formula (--bias-only)" if f.bias_only else f"mean and std over {n} samples"
    exact = "exact per cell" if f.block == 1 else f"blocks of {f.block} x {f.block} positions"
    return [f"  summary         yes (extract --summary): {over}; no per-sample matrices",
            f"  resolution      {f.resolution}: {exact}",
            f"  shape           {h} heads x {nb} query blocks x {nb} key blocks ({t} positions); profiles over "
            f"{t} distances"]  # fmt: skip


def _layer_lines(f: Any, layer: int, group: str) -> list[str]:
    """One line per dataset of a layer: type, shape (summaries), compression and chunks."""
    lines = []
    if not f.has_bias(layer):
        lines.append(f"  {group + '/bias':<16}absent (the scheme adds no bias)")
    if f.is_summary:
        from biasviz.store.datasets import ROWS

        names = f.summary_datasets(layer)  # rows of the table of datasets, in its order
        longest = max((len(group) + 1 + len(n) for n in names), default=0)
        width = 24 if longest < 24 else longest + 2  # a column as wide as the longest name, at least a space
        for name in names:
            ds = f.summary.h5[f"{group}/{name}"]
            dims = ROWS[name].dims if ds.ndim == len(ROWS[name].dims) else ("checkpoint", *ROWS[name].dims)
            lines.append(f"  {group + '/' + name:<{width}}{dtype_name(ds)} {tuple(ds.shape)} ({' x '.join(dims)}), "
                         f"{_filters(ds)}")  # fmt: skip
        note = f.summary.note(layer)
        if note:  # what the layer's summary leaves out, and why
            lines.append(f"  {group + ' note':<{width}}{note}")
        made = f.summary.statistics(layer)
        if made == "fused":  # the GPU kernels formed them (the torch path is the rule, and goes unsaid)
            lines.append(f"  {group + ' statistics':<{width}}fused: formed by the GPU kernels")
        return lines
    names = ("bias", "weights") if f.has_bias(layer) else ("weights",)
    for name in ("bias",) if f.bias_only else names:
        ds = f.dataset(name, layer)
        chunks = "x".join(map(str, ds.chunks)) if ds.chunks else "none"
        shared = f"; shared: one matrix for all {f.n_samples} samples" if getattr(ds, "shared", False) else ""
        lines.append(f"  {group + '/' + name:<16}{ds.dtype}, {_filters(ds)}, chunks {chunks}{shared}")
    return lines


def dtype_name(ds: Any) -> str:
    """A dataset's element type as info shows it: "compound" for a table of fields."""
    return "compound" if ds.dtype.fields else str(ds.dtype)


__all__ = ["MAX_SHOWN", "dtype_name", "summary"]
