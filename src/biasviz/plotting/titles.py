"""What a figure's title says of the data it draws: scheme, layer, length, which input, how the model was trained.

A reader of a figure cannot tell one sample from a mean, the last layer from the first, or a tiny run from a
trained GPT-2; the title says so, read from the file (whose attributes are data from elsewhere: checked, never
trusted). :func:`figure_title` words it, the same way in every figure kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from biasviz.plotting.style import literal
from biasviz.store import BiasFile
from biasviz.store.format import BIAS_DIFFERENCE, CALL_MODULES
from biasviz.store.h5io import call_modules, json_attr

#: Schemes as papers write them, the same in every figure that names one (see :func:`scheme_name`).
SCHEME_NAMES = {"alibi": "ALiBi", "kerple-log": "KERPLE-log", "kerple-power": "KERPLE-power", "fire": "FIRE",
                "t5": "T5", "cable": "CABLE", "fox": "FoX", "rope": "RoPE", "nope": "NoPE"}  # fmt: skip


def scheme_name(scheme: str) -> str:
    """A scheme as papers write it ('ALiBi', 'RoPE'); another model's scheme as the file holds it. Plain text:
    drawn through :func:`~biasviz.plotting.style.literal`, written to a caption through ``latex_escape``.

    >>> scheme_name("kerple-log"), scheme_name("my-bias")
    ('KERPLE-log', 'my-bias')
    """
    return SCHEME_NAMES.get(scheme, str(scheme))


def scheme_title(scheme: str) -> str:
    """:func:`scheme_name` as a figure's title draws it (a name from a file or the command line is text, never
    mathtext): the first words of every title that names a scheme."""
    return literal(scheme_name(scheme))


def which_sample(bf: BiasFile, kind: str, sample: int) -> str:
    """Which input one sample's figure shows (``--sample`` counts from 0, the figure's text from 1); a bias stored
    once says it was measured the same for all."""
    if kind == "bias" and bf.bias_shared and bf.n_samples > 1:
        measured = bf.attrs.get(BIAS_DIFFERENCE) == 0.0
        return f"one bias for all {bf.n_samples} samples" + (" (measured: each equals the first)" if measured else "")
    said = samples_text(bf.n_samples, sample)
    if kind == "bias" and bf.context_dependent and bf.n_samples > 1:
        said += " (the bias depends on the input)"
    return said


def layer_text(layer: int, n_layers: int | None, made_by: str | None = None) -> str:
    """The layer as figure text counts it, an ordinal (the file's ``layer_11``, ``--layer 11``, is the 12th), with
    how many the model has; the last is named so, first, since "layer 11 of 12" would read as the 11th. A traced
    model's layer is an attention call, which is not always a layer of the model (DiffLlama's two calls a layer, a
    hybrid's attention in some layers only): said so, with the module that ``made_by`` it (:func:`made_by`).

    >>> layer_text(11, 12), layer_text(0, 12), layer_text(3, None)
    ('final layer, 12 of 12', 'layer 1 of 12', 'layer 4')
    >>> layer_text(1, 4, "model.layers.0.self_attn"), layer_text(3, 4, "model.layers.1.self_attn")
    ('attention call 2 of 4 (model.layers.0.self_attn)', 'final attention call, 4 of 4 (model.layers.1.self_attn)')
    """
    unit, by = ("layer", "") if made_by is None else ("attention call", f" ({made_by or 'the model itself'})")
    if not n_layers:
        return f"{unit} {layer + 1}{by}"
    if layer == n_layers - 1:
        return f"final {unit}, {n_layers} of {n_layers}{by}"
    return f"{unit} {layer + 1} of {n_layers}{by}"


def sentence_case(text: str) -> str:
    """``text`` with its first letter upper case and the rest as it is (a module's name keeps its own case).

    >>> sentence_case("final attention call, 4 of 4 (model.Layers.1)")
    'Final attention call, 4 of 4 (model.Layers.1)'
    """
    return text[:1].upper() + text[1:]


def made_by(bf: BiasFile, layer: int) -> str | None:
    """The module of a traced model that made the attention call ``layer`` of ``bf`` (its ``call_modules``, checked:
    data from the file); None for a file of a model whose layers are its layers."""
    owners = call_modules(bf.attrs.get(CALL_MODULES), bf.n_layers)
    return None if owners is None or not 0 <= layer < len(owners) else owners[layer]


def samples_text(n_samples: int, sample: int | None = None, bias_only: bool = False) -> str:
    """Which input: 'mean of 64 samples', or one sample as an ordinal with how many there are ('sample 3 of 64' is
    ``--sample 2``, the third row of ``input_ids``), as layers and heads are counted in figure text.

    >>> samples_text(64), samples_text(1), samples_text(64, 2), samples_text(0, bias_only=True)
    ('mean of 64 samples', '1 sample', 'sample 3 of 64', "the scheme's formula (no text)")
    """
    if bias_only:
        return "the scheme's formula (no text)"
    if sample is not None:
        return f"sample {sample + 1} of {n_samples}"
    return "1 sample" if n_samples == 1 else f"mean of {n_samples} samples"


def figure_title(what: str, *, layer: int, n_layers: int | None, seq_len: int | str, which: str,
                 details: Sequence[str | None] = (), trained: str | None = None,
                 made_by: str | None = None) -> str:  # fmt: skip
    """The one wording of every figure's title: what it shows (scheme and quantity), the layer, T, which input, then
    ``details`` (how the figure was made) and how the model was trained, each its own clause.

    >>> figure_title("ALiBi bias", layer=11, n_layers=12, seq_len=512, which="mean of 64 samples")
    'ALiBi bias: final layer, 12 of 12; T = 512; mean of 64 samples'
    """
    clauses = [literal(layer_text(layer, n_layers, made_by)), f"T = {seq_len}", which, *details, trained]
    return f"{what}: " + "; ".join(c for c in clauses if c)


def file_title(bf: BiasFile, what: str, layer: int, which: str | None = None,
               details: Sequence[str | None] = ()) -> str:  # fmt: skip
    """:func:`figure_title` of a file: its layer count, length, samples (the mean, unless ``which`` says another
    input) and training record."""
    which = which or samples_text(bf.n_samples, bias_only=bf.bias_only)
    return figure_title(what, layer=layer, n_layers=bf.n_layers, seq_len=bf.seq_len, which=which, details=details,
                        trained=trained_text(bf), made_by=made_by(bf, layer))  # fmt: skip


def trained_text(bf: BiasFile) -> str | None:
    """:func:`trained_note` of the file, drawn as the characters it holds (None where the file does not say)."""
    note = trained_note(bf.attrs.get("training"))
    return literal(note) if note else None


def trained_suffix(bf: BiasFile) -> str:
    """'; tiny model, 300 training steps on 128-token windows' where the file says how biasviz trained the model."""
    note = trained_text(bf)
    return f"; {note}" if note else ""


def trained_note(value: Any) -> str | None:
    """'tiny model, 300 training steps on 128-token windows' from the ``training`` attribute a file records (JSON
    text, from the checkpoint's training.json; None where it records none, or something else: data, not trusted).

    >>> trained_note('{"preset": "tiny", "steps": 300, "seq_len": 128, "corpus": "stdlib:/usr/lib/python3.11"}')
    'tiny model, 300 training steps on 128-token windows'
    >>> trained_note('{"preset": "tiny", "steps": [0, 100, 300], "seq_len": 128}')
    'tiny model, checkpoints of 0 to 300 training steps on 128-token windows'
    >>> trained_note('not json') is None
    True
    """
    doc = json_attr(value)
    if not isinstance(doc, dict):
        return None
    preset, steps, seq_len = doc.get("preset"), doc.get("steps"), doc.get("seq_len")
    if not (isinstance(preset, str) and isinstance(seq_len, int)) or len(preset) > 40:
        return None
    if isinstance(steps, list) and steps and all(isinstance(x, int) for x in steps):  # a sweep: every checkpoint's
        span = f"{min(steps):,} to {max(steps):,}"
        return f"{preset} model, checkpoints of {span} training steps on {seq_len}-token windows"
    if not isinstance(steps, int) or isinstance(steps, bool):
        return None
    return f"{preset} model, {steps:,} training steps on {seq_len}-token windows"


__all__ = ["figure_title", "file_title", "layer_text", "made_by", "samples_text", "scheme_name", "scheme_title",
           "sentence_case", "trained_note", "trained_suffix", "trained_text", "which_sample"]
