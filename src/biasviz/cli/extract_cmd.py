"""``biasviz extract``: capture a model's per-head biases and attention weights into HDF5."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from biasviz.cli import in_place_when_published, lasting_objects, output_in_place
from biasviz.cli.options import (
    NonEmptyPath,
    config_option,
    device_map_options,
    device_option,
    seed_option,
    with_config,
)
from biasviz.common.errors import BiasvizError, UsageError
from biasviz.common.terminal import say


def parse_layers(spec: str | int) -> int | str | list[int]:
    """``-1``, ``11``, ``0,5,11`` or ``all``."""
    text = str(spec).strip().lower()
    if text == "all":
        return "all"
    try:
        items = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--layer takes -1, an index, a comma-separated list or 'all', not '{spec}'") from None
    if not items:
        raise UsageError("--layer is empty; use -1 for the final layer")
    return items[0] if len(items) == 1 else items


@contextlib.contextmanager
def warnings_as_notes() -> Iterator[None]:
    """Show library warnings as one ``Warning:`` line each, without file names and line numbers.

    Under torchrun only process 0 shows them (every process would say the same).
    """
    import os

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            yield
        finally:
            for w in caught if os.environ.get("RANK", "0") == "0" else ():
                if issubclass(w.category, UserWarning):
                    say("Warning", str(w.message))


@click.command()
@config_option
@click.option(
    "--model", required=True,
    help="A 'biasviz train' checkpoint directory, a nanoGPT-style state dict (.pt/.pth/.safetensors), a "
    "transformers checkpoint directory, or your own code as path/to/code.py:FACTORY (FACTORY() returns the "
    "torch.nn.Module; its SDPA / flex_attention calls are traced and --layer counts them).",
)  # fmt: skip
@click.option(
    "--checkpoint", default=None,
    help="With --model CODE.py:FACTORY: passed to FACTORY(checkpoint), for your code to load.",
)  # fmt: skip
@click.option(
    "--scheme", default=None,
    help="Positional scheme. Needed only for state dicts whose keys do not tell it "
    "(attn.h_attn -> cable, wpe -> learned); otherwise checked against the checkpoint.",
)  # fmt: skip
@click.option(
    "--layer", "layer", default="-1", show_default=True,
    help="Layer(s) to capture: -1 (the final layer), an index, a comma-separated list, or 'all'.",
)  # fmt: skip
@click.option("--samples", default=4, show_default=True, type=click.IntRange(min=1), help="Windows of text to run.")
@click.option("--seq-len", default=512, show_default=True, type=click.IntRange(min=1), help="Tokens per window (T).")
@click.option(
    "--text", default=None,
    help="Text file or directory of text files to cut windows from [default: Python's standard library source].",
)  # fmt: skip
@click.option(
    "--tokenizer", default=None,
    help="tokenizer.json (or a directory holding one) [default: the checkpoint's own; for a state dict "
    "without one, UTF-8 bytes if the vocabulary holds them].",
)  # fmt: skip
@seed_option
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1), help="Windows per forward.")
@device_option
@device_map_options
@click.option(
    "--dtype", default="float32", show_default=True, type=click.Choice(["float32", "float16"]),
    help="Storage type of bias and weights.",
)  # fmt: skip
@click.option(
    "--model-dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]),
    help="Precision the model runs in (bfloat16/float16 halve its memory on a GPU). Attention weights are "
    "always formed in float32 from the model's q and k; the bias is what the model computes in this precision.",
)  # fmt: skip
@click.option("--out", type=NonEmptyPath(), default=None,
              help="HDF5 file to write [default: data/<scheme>.h5].")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option(
    "--no-scale", is_flag=True,
    help="Do not scale q.k by 1/sqrt(d_head), as the CABLE reference implementation does not; use it for "
    "checkpoints of that code so the weights match exactly (the bias is unaffected).",
)  # fmt: skip
@click.option(
    "--part", default=None, type=click.Choice(["encoder", "decoder"]),
    help="For encoder-decoder models (T5): the stack to capture [default: encoder].",
)  # fmt: skip
@click.option(
    "--bias-only", is_flag=True,
    help="Context-free schemes: store the bias over --seq-len positions with no text and no forward pass "
    "(one sample, no attention weights); any length that fits in memory.",
)  # fmt: skip
@click.option(
    "--checkpoints", default=None,
    help="Sweep a checkpoint series on the same windows into one file with a leading checkpoint dimension: "
    "--model DIR holding checkpoint folders (checkpoint-N, global_stepN, iter_000N, step_N, stepN, "
    "stage1-stepN-tokensNB) or ORG/NAME with revisions in the local Hugging Face cache. all, first,last, steps "
    "or names (200,400 or step1000), or log:N (N log-spaced, first and last included).",
)  # fmt: skip
@click.option(
    "--step-pattern", default=None,
    help="With --checkpoints: a regular expression for other folder or revision names, matching the whole name, "
    "with a named group 'step' (and optionally 'tokens'), e.g. 'ckpt-(?P<step>\\d+)'.",
)  # fmt: skip
@click.option(
    "--resume", is_flag=True,
    help="With --checkpoints: finish an interrupted sweep (kept in OUT.partial/) after checking it ran on the same "
    "windows, checkpoints and settings; only the missing checkpoints are extracted.",
)  # fmt: skip
@click.option(
    "--summary", is_flag=True,
    help="Store what figures and diagnostics read instead of every sample's matrices: per layer the mean and "
    "standard deviation over samples as maps of at most --resolution blocks, distance profiles and the "
    "diagnostics at full resolution. Size independent of --samples; any --seq-len.",
)  # fmt: skip
@click.option(
    "--resolution", default=None, type=int,
    help="With --summary or --bias-only: at most R x R blocks per map, each ceil(T / R) positions wide "
    "(exact per cell when R = T) [default: 1024, or T when shorter].",
)  # fmt: skip
@click.option(
    "--capture", default=None, metavar="NAMES",
    help="What a full file stores per layer, comma-separated: bias, weights, scores (the softmax's input, "
    "docs/positional.md) [default: bias,weights]. Summaries always keep the scores' maps.",
)  # fmt: skip
@click.option("--quiet", is_flag=True, help="No progress: no bar on a terminal, no heartbeat lines in a log.")
def extract(
    model: str, checkpoint: str | None, scheme: str | None, layer: str, samples: int, seq_len: int, text: str | None,
    tokenizer: str | None,
    seed: int, batch_size: int, device: str, device_map: str | None, max_memory: str | None, offload_folder: str | None,
    dtype: str, model_dtype: str, out: str | None, force: bool, no_scale: bool,
    part: str | None, bias_only: bool, checkpoints: str | None, step_pattern: str | None, resume: bool, summary: bool,
    resolution: int | None, capture: str | None, quiet: bool,
) -> None:  # fmt: skip
    """Capture the final layer's per-head additive bias and attention weights into HDF5 (format 1).

    Writes /input_ids and /layer_L/{bias,weights} (sample, head, query, key); cells after the query
    hold NaN (bias) and 0 (weights). With --summary: per layer the mean and spread over samples as maps,
    distance profiles and diagnostics, at any --seq-len. The file appears only when complete.
    """
    with lasting_objects():  # torch, transformers and the rest: objects that live as long as the process
        from biasviz.adapters.device_map import offload_space, placement_attrs
        from biasviz.common.devices import PeakMemory
        from biasviz.common.exclusive import writing_alone
        from biasviz.common.outputs import check_output_file
        from biasviz.common.processes import process_group
        from biasviz.common.settings import attention_mode
        from biasviz.data import encode_prefix, open_corpus, sample_windows, window_span
        from biasviz.extraction.distributed import extract_parallel
        from biasviz.extraction.run import check_seq_len, check_windows_memory
        from biasviz.extraction.run import extract as run_extract
        from biasviz.extraction.tokens import resolve_tokenizer

    attention_mode()  # checked before any work
    layers = parse_layers(layer)
    if resolution is not None and not (summary or bias_only):
        raise UsageError("--resolution applies with --summary or --bias-only")
    if summary and bias_only:
        raise UsageError("--bias-only with --resolution already writes a summary; drop --summary")
    kinds = _capture_kinds(capture, summary=summary, bias_only=bias_only, sweep=bool(checkpoints))
    if bias_only:
        _refuse_with_bias_only(text=text, tokenizer=tokenizer, no_scale=no_scale)
    for given, flag in ((step_pattern, "--step-pattern"), (resume, "--resume")):
        if given and not checkpoints:
            raise UsageError(f"{flag} applies with --checkpoints")
    if checkpoints and (bias_only or checkpoint):
        raise UsageError(f"--checkpoints cannot apply with {'--bias-only' if bias_only else '--checkpoint'}")
    placement = _placement(device_map, max_memory, offload_folder, model_dtype, device, bias_only, checkpoint)
    inputs = with_config(model, text, tokenizer, checkpoint)
    if out:  # checked before the model is loaded
        check_output_file(Path(out), inputs, force)
    series = None
    if not checkpoints and not Path(model).expanduser().exists():
        from biasviz.extraction.hub import is_repo_id

        if is_repo_id(model):
            raise BiasvizError(f"--model {model} does not exist (no such folder or file); if it names a model in "
                               "the local Hugging Face cache, read its revisions with --checkpoints (e.g. "
                               "--checkpoints last or step1000)")  # fmt: skip
    if checkpoints:  # the series first: --model may be a folder of checkpoints only, or ORG/NAME in the hub cache
        from biasviz.extraction.sweep import resolve_series

        with warnings_as_notes():
            series = resolve_series(model, checkpoints, step_pattern)
    # SIGTERM unwinds like Ctrl-C in every command (biasviz.cli.main), so temporary files are removed
    with process_group(device) as (w, dev), contextlib.ExitStack() as held:  # under torchrun: one of several
        if w.size > 1 and bias_only:
            raise UsageError("--bias-only runs in one process; start it without torchrun")
        placement, peaks = held.enter_context(offload_space(placement)), PeakMemory() if placement else None
        first = str(series.chosen[0].path) if series is not None else model  # its tokenizer reads the text
        adapter = _load(first, None if series else checkpoint, scheme, no_scale, part, placement)
        if placement is not None:  # the model stays where the map put it; inputs go where its first layer runs
            dev = adapter.device
        target = check_output_file(Path(out) if out else Path("data") / f"{adapter.scheme}.h5", inputs, force)
        if w.main:  # one process writes the target: a second run to the same --out fails now, not at the end
            held.enter_context(writing_alone(target))
        # a traced model's attention calls are counted on the first sample, inside extraction
        chosen = adapter.resolve_layers(layers) if adapter.n_layers else layers
        check_seq_len(adapter, seq_len)
        if bias_only:
            from biasviz.extraction.bias_only import extract_bias_only

            if resolution is not None:
                from biasviz.extraction.bias_only import bias_only_summary  # noqa: I001

                result = bias_only_summary(adapter, seq_len, target, layers=chosen, resolution=resolution, device=dev,
                                           model_dtype=model_dtype, force=force)  # fmt: skip
                shape = _blocks(seq_len, resolution)
            else:
                result = extract_bias_only(adapter, seq_len, target, layers=chosen, dtype=dtype, device=dev,
                                           model_dtype=model_dtype, force=force)  # fmt: skip
                shape = f"{seq_len} x {seq_len}, {dtype}"
            output_in_place()  # complete and at --out
            click.echo(f"wrote {result.path}: the bias of layer {', '.join(map(str, result.layers))}, "
                       f"{adapter.n_heads} heads x {shape}, no text (--bias-only), "
                       f"{result.bytes / 1e6:.1f} MB in {result.seconds:.1f} s")  # fmt: skip
            return
        check_windows_memory(samples, seq_len)
        with warnings_as_notes():
            tok, tok_desc = resolve_tokenizer(adapter, tokenizer)
        with warnings_as_notes():  # a text file that is not UTF-8 is read with a warning
            documents, text_source = open_corpus(text)  # read and tokenized only as far as the windows need
            ids = encode_prefix(documents, tok, window_span(samples, seq_len))
        windows = sample_windows(ids, samples, seq_len, seed)
        run = {"layers": chosen, "dtype": dtype, "batch_size": batch_size, "device": dev, "model_dtype": model_dtype,
               "force": force, "seed": seed, "text_source": text_source,
               "attrs": {"tokenizer": tok_desc, **placement_attrs(adapter.model, placement, peaks)},
               "progress": False if quiet else None}  # fmt: skip
        if summary:
            run["resolution"] = resolution
        elif kinds is not None:
            run["capture"] = kinds
        if checkpoints:
            from biasviz.extraction.sweep import extract_sweep

            options = {k: v for k, v in (("attn_scale", 1.0 if no_scale else None), ("part", part),
                                         ("placement", placement)) if v is not None}  # fmt: skip
            with warnings_as_notes():  # checkpoints found identical are said when the sweep is joined
                result = extract_sweep(model, checkpoints, windows, target, scheme=scheme, summary=summary,
                                       resume=resume, series=series, w=w, model_options=options,
                                       first=adapter if w.main else None, **run)  # fmt: skip
        elif summary and w.size > 1:
            from biasviz.extraction.distributed import summarise_parallel

            result = summarise_parallel(adapter, windows, target, w=w, **run)
        elif summary:
            from biasviz.extraction.summary import extract_summary

            in_place_when_published()
            result = extract_summary(adapter, windows, target, **run)
        elif w.size > 1:
            result = extract_parallel(adapter, windows, target, w=w, **run)
        else:
            in_place_when_published()
            result = run_extract(adapter, windows, target, **run)
        output_in_place()  # the file is complete and at --out: what follows only reports it
        if not w.main:
            return
        if summary:
            stored = _summarised(result.path, result.layers[0], adapter.scheme)
            if result.samples < 2 and "positional" not in stored:
                click.echo("note: no positional logits P: P needs two samples or more (it pairs the queries of one "
                           "text with the keys of another, docs/positional.md); run with --samples 2 or more",
                           err=True)  # fmt: skip
        else:
            stored = _listed([k for k in kinds or ("bias", "weights") if k != "bias" or result.has_bias],
                             adapter.scheme, result.has_bias or bool(kinds and "bias" not in kinds))  # fmt: skip
        names = ", ".join(str(x) for x in result.layers)
        where = f", {w.size} processes" if w.size > 1 else ""
        if series is not None:
            steps = [str(c.step) for c in series.chosen]
            shown = ", ".join(steps if len(steps) <= 8 else [*steps[:4], "...", *steps[-3:]])
            where += f", {len(steps)} checkpoints (steps {shown})"
        if summary:
            maps = _blocks(result.seq_len, resolution)
            shape = f"summary of {result.samples} samples: {adapter.n_heads} heads x {maps}"
        else:
            shape = f"{result.samples} samples x {adapter.n_heads} heads x {result.seq_len} x {result.seq_len}"
        click.echo(
            f"wrote {result.path}: {shape}, layer {names} {stored}, {'float32' if summary else dtype}{where}, "
            f"{result.bytes / 1e6:.1f} MB in {result.seconds:.1f} s"
        )


def _load(model: str, checkpoint: str | None, scheme: str | None, no_scale: bool, part: str | None,
          placement: Any = None) -> Any:  # fmt: skip
    """The adapter for ``--model``: a checkpoint or state dict, or the user's ``code.py:FACTORY``."""
    from biasviz.adapters import load_model
    from biasviz.adapters.factory import is_factory_spec, load_factory

    with warnings_as_notes(), lasting_objects():  # the model and what its load imports live to the end
        if is_factory_spec(model):
            for given, flag in ((no_scale, "--no-scale"), (part, "--part"), (placement, "--device-map")):
                if given:
                    raise UsageError(f"{flag} does not apply to --model CODE.py:FACTORY (your code builds the model)")
            return load_factory(model, checkpoint, scheme)
        if checkpoint is not None:
            raise UsageError("--checkpoint applies to --model CODE.py:FACTORY only; give a checkpoint as --model")
        return load_model(model, scheme, attn_scale=1.0 if no_scale else None, part=part, placement=placement)


def _placement(device_map: str | None, max_memory: str | None, offload_folder: str | None, model_dtype: str,
               device: str, bias_only: bool, checkpoint: str | None) -> Any:  # fmt: skip
    """The checked --device-map, --max-memory and --offload-folder (None without a map), before anything loads."""
    from biasviz.adapters.device_map import placement_from
    from biasviz.common.processes import world

    if device_map is not None and world().size > 1:  # refused before the processes wait for each other
        raise UsageError("--device-map runs in one process (the map spreads one model over this machine's devices); "
                         "start it without torchrun")  # fmt: skip
    if device_map is not None and device.strip().lower() != "auto":
        raise UsageError(f"--device {device} does not apply with --device-map: the map places every module (inputs go "
                         "where the first layer runs); use --max-memory to choose the devices")  # fmt: skip
    if device_map is not None and (bias_only or checkpoint):
        raise UsageError(f"--device-map cannot apply with {'--bias-only' if bias_only else '--checkpoint'}: it loads "
                         "a transformers model directory to run it")  # fmt: skip
    return placement_from(device_map, max_memory, offload_folder, model_dtype)


def _refuse_with_bias_only(**given: object) -> None:
    """--bias-only reads no text and runs no forward pass: options for those would be silently ignored."""
    named = [f"--{k.replace('_', '-')}" for k, v in given.items() if v]
    if named:
        raise UsageError(f"{', '.join(named)} cannot apply with --bias-only, which reads no text and computes no "
                         "attention weights; drop one or the other")  # fmt: skip


def _blocks(seq_len: int, resolution: int | None) -> str:
    """``1024 x 1024 blocks of 16 positions`` (or ``512 x 512 cells``) for the summary of ``seq_len`` positions."""
    from biasviz.store.format import DEFAULT_RESOLUTION, block_size

    b = block_size(seq_len, min(DEFAULT_RESOLUTION, seq_len) if resolution is None else resolution)
    nb = -(-seq_len // b)
    return f"{nb} x {nb} cells" if b == 1 else f"{nb} x {nb} blocks of {b} positions"


def _summarised(path: Path, layer: int, scheme: str) -> str:
    """What a summary file holds, as read back from it: bias, weights, scores, positional logits."""
    import h5py

    with h5py.File(path, "r") as f:
        names = set(f[f"layer_{layer}"])
    held = [label for label, key in (("bias", "bias_mean"), ("weights", "weights_mean"), ("scores", "scores_mean"),
                                     ("positional logits", "positional_mean"), ("position measures", "band_mass"),
                                     ("rotary frequencies", "frequency_use")) if key in names]  # fmt: skip
    if "band_mass" in names and "frequency_use" not in names:
        click.echo("note: no rotary frequency measures (docs/position-measures.md): no rotary module was found in "
                   "the model", err=True)  # fmt: skip
    elif "frequency_use" in names and "positional_frequency" not in names:
        click.echo("note: no positional_frequency: it needs two samples, the model's rows formed again and a mask "
                   "that is a rule of distance", err=True)  # fmt: skip
    return _listed(held, scheme, "bias" in held)


def _listed(held: list[str], scheme: str, adds_bias: bool) -> str:
    """'bias, weights and scores'; where the model adds no bias, it says so."""
    text = ", ".join(held[:-1]) + f" and {held[-1]}" if len(held) > 1 else "".join(held)
    return text if adds_bias else f"{text} (scheme '{scheme}' adds no bias)"


def _capture_kinds(capture: str | None, *, summary: bool, bias_only: bool, sweep: bool) -> list[str] | None:
    """--capture as the kinds a full file stores (None: the default), refused where it cannot apply."""
    if capture is None:
        return None
    from biasviz.extraction.run import parse_capture

    kinds = parse_capture(capture)
    if summary or bias_only:
        raise UsageError(f"--capture applies to full files; {'--summary' if summary else '--bias-only'} stores "
                         f"{'the maps of bias, weights and scores' if summary else 'the bias alone'}")  # fmt: skip
    if sweep and "scores" in kinds:
        raise UsageError("--capture scores cannot apply with --checkpoints yet; extract each checkpoint with --model")
    return kinds
