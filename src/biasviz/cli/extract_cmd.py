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
@click.option(
    "--compression", default=None, metavar="gzip|gzip:N|lzf|none",
    help="How a full file's matrices are stored: gzip (shuffle + deflate level 1), gzip:N (level N, 0-9), lzf "
    "(h5py's built-in LZF filter: every h5py reads it without plugins, other HDF5 tools may need the LZF plugin) or "
    "none (fastest to write, largest) [default: gzip]. Summary files keep their own gzip.",
)  # fmt: skip
@click.option("--quiet", is_flag=True, help="No progress: no bar on a terminal, no heartbeat lines in a log.")
def extract(layer: str, quiet: bool, **given: Any) -> None:
    """Capture the final layer's per-head additive bias and attention weights into HDF5 (format 1).

    Writes /input_ids and /layer_L/{bias,weights} (sample, head, query, key); cells after the query
    hold NaN (bias) and 0 (weights). With --summary: per layer the mean and spread over samples as maps,
    distance profiles and diagnostics, at any --seq-len. The file appears only when complete.
    """
    with lasting_objects():  # torch, transformers and the rest: objects that live as long as the process
        from biasviz.adapters.device_map import offload_space, placement_attrs
        from biasviz.cli.extract_report import report
        from biasviz.common.devices import PeakMemory
        from biasviz.common.exclusive import writing_alone
        from biasviz.common.outputs import check_output_file
        from biasviz.common.processes import process_group
        from biasviz.common.settings import attention_mode
        from biasviz.extraction.request import ExtractRequest, run
        from biasviz.extraction.run import check_seq_len

    attention_mode()  # checked before any work
    request = ExtractRequest(layers=parse_layers(layer), progress=False if quiet else None, **given)
    placement = request.placement()  # the map read and checked before anything loads
    inputs = with_config(request.model, request.text, request.tokenizer, request.checkpoint)
    if request.out:  # checked before the model is loaded
        check_output_file(Path(request.out), inputs, request.force)
    series = _series(request)
    # SIGTERM unwinds like Ctrl-C in every command (biasviz.cli.main), so temporary files are removed
    with process_group(request.device) as (w, dev), contextlib.ExitStack() as held:  # under torchrun: one of several
        placement, peaks = held.enter_context(offload_space(placement)), PeakMemory() if placement else None
        first = str(series.chosen[0].path) if series is not None else request.model  # its tokenizer reads the text
        adapter = _load(request, first, None if series else request.checkpoint, placement)
        if placement is not None:  # the model stays where the map put it; inputs go where its first layer runs
            dev = adapter.device
        target = check_output_file(Path(request.out or Path("data") / f"{adapter.scheme}.h5"), inputs, request.force)
        if w.main:  # one process writes the target: a second run to the same --out fails now, not at the end
            held.enter_context(writing_alone(target))
        # a traced model's attention calls are counted on the first sample, inside extraction
        chosen = adapter.resolve_layers(request.layers) if adapter.n_layers else request.layers
        check_seq_len(adapter, request.seq_len)
        windows, extra = None, {}
        if not request.bias_only:
            windows, text_source, tok_desc = _windows(request, adapter)
            extra = {"text_source": text_source,
                     "attrs": {"tokenizer": tok_desc, **placement_attrs(adapter.model, placement, peaks)}}  # fmt: skip
            if w.size == 1 and not request.checkpoints:
                in_place_when_published()
        # checkpoints found identical are said when a sweep is joined
        with warnings_as_notes() if request.checkpoints else contextlib.nullcontext():
            result = run(request, adapter, windows, target, layers=chosen, device=dev, w=w, series=series,
                         placement=placement, **extra)  # fmt: skip
        output_in_place()  # the file is complete and at --out: what follows only reports it
        if w.main:
            report(request, adapter, result, w, series)


def _series(request: Any) -> Any:
    """The checkpoints of --checkpoints (None without), and a --model that names nothing refused, before any load."""
    if not request.checkpoints and not Path(request.model).expanduser().exists():
        from biasviz.extraction.hub import is_repo_id

        if is_repo_id(request.model):
            raise BiasvizError(f"--model {request.model} does not exist (no such folder or file); if it names a model "
                               "in the local Hugging Face cache, read its revisions with --checkpoints (e.g. "
                               "--checkpoints last or step1000)")  # fmt: skip
    if not request.checkpoints:
        return None
    from biasviz.extraction.sweep import resolve_series  # --model: a folder of checkpoints, or ORG/NAME in the cache

    with warnings_as_notes():
        return resolve_series(request.model, request.checkpoints, request.step_pattern)


def _load(request: Any, model: str, checkpoint: str | None, placement: Any) -> Any:
    """The adapter for ``--model``: a checkpoint or state dict, or the user's ``code.py:FACTORY``."""
    from biasviz.adapters import load_model
    from biasviz.adapters.factory import is_factory_spec, load_factory

    with warnings_as_notes(), lasting_objects():  # the model and what its load imports live to the end
        if is_factory_spec(model):
            return load_factory(model, checkpoint, request.scheme)
        return load_model(model, request.scheme, **request.model_options(placement))


def _windows(request: Any, adapter: Any) -> tuple[Any, str, str]:
    """The token windows of --text (read and tokenized only as far as they need), its description and the
    tokenizer's."""
    from biasviz.data import encode_prefix, open_corpus, sample_windows, window_span
    from biasviz.extraction.run import check_windows_memory
    from biasviz.extraction.tokens import resolve_tokenizer

    check_windows_memory(request.samples, request.seq_len)
    with warnings_as_notes():
        tok, tok_desc = resolve_tokenizer(adapter, request.tokenizer)
    with warnings_as_notes():  # a text file that is not UTF-8 is read with a warning
        documents, text_source = open_corpus(request.text)
        ids = encode_prefix(documents, tok, window_span(request.samples, request.seq_len))
    return sample_windows(ids, request.samples, request.seq_len, request.seed), text_source, tok_desc


def _summarised(path: Path, layer: int, scheme: str) -> str:
    """What a summary file holds (:func:`biasviz.cli.extract_report.summarised`)."""
    from biasviz.cli.extract_report import summarised

    return summarised(path, layer, scheme)
