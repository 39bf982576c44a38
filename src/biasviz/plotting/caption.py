"""A LaTeX caption for a figure, written beside it (``plot --caption``): what a paper's caption must say, from the file.

A caption names the quantity and its units, the model (as the file records it) and how it was trained, the layer,
T, which input, how to read the axes and the colour scale (../docs/paper-figures.md). Every value read from the
file (scheme, source model, training note, text source) is data from elsewhere: it is escaped character by character
(:func:`latex_escape`), so that a source model named ``\\input{/etc/passwd}`` prints as those characters instead of
running as LaTeX. Only the wording biasviz itself writes (the math of the quantity) is LaTeX.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from biasviz.common.atomic import Staged, write_new
from biasviz.plotting.titles import layer_text, made_by, sentence_case, trained_note
from biasviz.store import BiasFile
from biasviz.store.datasets import map_name

if TYPE_CHECKING:
    from matplotlib.figure import Figure, SubFigure

#: Characters that LaTeX reads as commands, groups, math, alignment, parameters, comments or spaces: each one
#: as a command that prints it. Control characters (a newline ends a paragraph, which a caption cannot hold) and
#: ``<``, ``>``, ``|`` (other glyphs in LaTeX's default OT1 encoding) are spelled out too.
_LATEX = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#",
          "^": r"\textasciicircum{}", "_": r"\_", "%": r"\%", "~": r"\textasciitilde{}", "<": r"\textless{}",
          ">": r"\textgreater{}", "|": r"\textbar{}"}  # fmt: skip
#: Longest text taken from one attribute: a caption is a sentence, not a dump of whatever a file holds.
MOST_CHARS = 200

#: The quantity each figure kind draws and its units, as LaTeX (biasviz's own wording: not escaped).
QUANTITIES = {
    "bias": r"bias $b_h(i, j)$ (added to the scaled score $q_i \cdot k_j / \sqrt{d}$; logits)",
    "weights": r"attention weights $a_h(i, j)$ (post-softmax; each row sums to 1)",
    map_name("bias", "std"): r"per-cell standard deviation over samples of the bias $b_h(i, j)$ (logits)",
    map_name("weights", "std"): r"per-cell standard deviation over samples of the attention weights $a_h(i, j)$",
    "positional": r"positional logits $P(i, j)$ relative to each head's $P$ at distance 0 (logits)",
}

#: The quantity of each figure kind that is not a heatmap (distance profiles, sinks, the training dynamics).
PROFILE_QUANTITIES = {
    "bias": r"mean bias $b_h(d)$ over samples and the cells at distance $d = i - j$, against $d$, with a band of "
    r"$\pm 1$ standard deviation (logits)",
    "weights": r"mean attention weight over samples and the cells at distance $d = i - j$, against $d$, with a "
    r"band of $\pm 1$ standard deviation",
    "positional": r"positional logits $P(d)$ against distance $d = i - j$, over all keys and over keys $j \ge 4$, "
    r"with the bias $b(d)$ where the model adds one (logits)",
    "sinks": r"mean attention weight on each of the first keys $j$ (key 0's weight is the head's sink share)",
    "dynamics": r"mean bias $b_h(d)$ against distance $d = i - j$ at each training checkpoint (logits)",
    "bands": r"attention weight a query puts on the keys at each distance $d = i - j$ (per distance: each bin's "
    r"weight over its width), mean over queries and samples",
    "context": r"attention weight on each tenth of the keys a query sees (earliest first), mean over queries and "
    r"samples",
    "frequency": r"mean 2-norm of each rotary pair $f$ of $q$ and of $k$ ($f = 0$ turns fastest), over samples and "
    r"positions (right of a dotted line, where there are any: the unrotated dims, one norm for all of them)",
    "entropy": r"entropy $-\sum_j a_h(i, j) \ln a_h(i, j)$ of each query's attention weights (nats), mean over "
    r"samples",
}


def latex_escape(text: object) -> str:
    """``text`` as LaTeX that prints exactly these characters (at most :data:`MOST_CHARS` of them).

    >>> print(latex_escape(r"\\input{/etc/passwd}} 50% $x_1^2$ & #~"))
    \\textbackslash{}input\\{/etc/passwd\\}\\} 50\\% \\$x\\_1\\textasciicircum{}2\\$ \\& \\#\\textasciitilde{}
    """
    raw = str(text)
    cut = raw[:MOST_CHARS] + ("..." if len(raw) > MOST_CHARS else "")
    return "".join(_LATEX.get(c, "~" if c == "\u00a0" else " " if c.isspace() or not c.isprintable() else c)
                   for c in cut)


def _file_text(bf: BiasFile, name: str) -> str | None:
    """A text attribute of the file, or None where it holds none (or not text: data, not trusted)."""
    value = bf.attrs.get(name)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) and value.strip() else None


def _heads(heads: list[int]) -> str:
    return ("head " if len(heads) == 1 else "heads ") + ", ".join(map(str, heads))


def scale_sentence(kinds_of_scale: Sequence[str], *, shared: bool, log: bool, kind: str) -> str:
    """How the colours read, from what each head's scale is, as :func:`biasviz.plotting.scales.head_scales` decided
    them (:func:`drawn_scales`): 'sequential', 'diverging' (values that change sign, each side to its own extreme),
    'symmetric' (values that change sign, one side under a twentieth of the range: +-the larger magnitude),
    'centred' (values of one sign on the figure's diverging map, +-their largest magnitude) or 'zero'.

    >>> scale_sentence(["sequential", "sequential"], shared=False, log=False, kind="bias")
    "One colour scale per head, sequential from the head's minimum to its maximum."
    >>> scale_sentence(["centred", "diverging", "symmetric"], shared=False, log=False, kind="bias")
    'One diverging colour scale per head, white at 0: each side to its own extreme for head 2, whose values \
change sign; symmetric about 0, to the largest magnitude, for head 3, whose smaller side is under a twentieth of \
the range, and for head 1, whose values have one sign.'
    """
    if log:
        return ("One logarithmic colour scale for all heads, from the smallest positive weight (at least $10^{-4}$ "
                "of the largest) to the largest.")  # fmt: skip
    std = kind.endswith("_std")
    by = {k: [h + 1 for h, got in enumerate(kinds_of_scale) if got == k] for k in ("diverging", "symmetric",
                                                                                  "centred", "zero")}  # fmt: skip
    if shared:
        shape = "diverging about 0 (white)" if kinds_of_scale and kinds_of_scale[0] != "sequential" else "sequential"
        said = f"One colour scale for all heads, {shape}, from their joint minimum to their maximum"
    elif std:
        said = "One colour scale per head, from 0 to the head's largest standard deviation"
    elif by["diverging"] or by["symmetric"] or by["centred"]:
        parts = []
        if by["diverging"]:
            parts.append(f"each side to its own extreme for {_heads(by['diverging'])}, whose values change sign")
        even = []
        if by["symmetric"]:
            even.append(f"for {_heads(by['symmetric'])}, whose smaller side is under a twentieth of the range")
        if by["centred"]:
            even.append(f"for {_heads(by['centred'])}, whose values have one sign")
        if even:
            parts.append("symmetric about 0, to the largest magnitude, " + ", and ".join(even))
        said = "One diverging colour scale per head, white at 0: " + "; ".join(parts)
    else:
        said = "One colour scale per head, sequential from the head's minimum to its maximum"
    if kind.startswith("weights") and not std:
        said += " (weights above each scale's 99.5th percentile marked by the colour bar's arrow)"
    if by["zero"]:
        said += f"; {_heads(by['zero'])} 0 within float32 rounding, drawn as 0"
    return said + "."


def drawn_scales(fig: Figure | SubFigure) -> list[str]:
    """Each panel's colour scale as the figure drew it, head by head (the kinds of :func:`scale_sentence`), read
    from the images and their norms, not re-decided."""
    import numpy as np
    from matplotlib.colors import LogNorm, TwoSlopeNorm

    from biasviz.plotting.scales import ZERO_BELOW, symmetric

    said = []
    for ax in fig.axes:
        for im in ax.get_images():
            values = np.ma.filled(np.ma.asarray(im.get_array(), dtype=float), np.nan)
            finite = values[np.isfinite(values)]
            zero = not isinstance(im.norm, LogNorm) and (finite.size == 0 or np.abs(finite).max() < ZERO_BELOW)
            if zero:
                said.append("zero")
            elif not isinstance(im.norm, TwoSlopeNorm):
                said.append("sequential")
            elif not symmetric(im.norm):
                said.append("diverging")
            else:
                said.append("symmetric" if finite.min() < 0.0 < finite.max() else "centred")
    return said


@dataclass
class Caption:
    """What one figure's caption says; :meth:`latex` writes it (file values escaped there, and only there)."""

    scheme: str
    what: str  # LaTeX: biasviz's own wording of the quantity (QUANTITIES)
    layer: int | None
    which: str  # plain text: 'mean of 8 samples', 'sample 0 (of 8)'
    details: list[str] = field(default_factory=list)  # plain text clauses: block means, reductions
    reading: str | None = None  # LaTeX: how to read the axes and colours (biasviz's own words)

    def latex(self, bf: BiasFile) -> str:
        """The ``\\caption{...}`` text, one line per sentence, ending in a newline."""
        model = model_clauses(bf, self.scheme)
        said = None if self.layer is None else layer_text(self.layer, bf.n_layers, made_by(bf, self.layer))
        where = [latex_escape(sentence_case(said))] if said is not None else []
        where += [f"$T = {int(bf.seq_len)}$", latex_escape(self.which)]
        text_source = _file_text(bf, "text_source")
        if text_source and not bf.bias_only:
            where.append(f"text: {latex_escape(text_source)}")
        lines = [f"{self.what[:1].upper()}{self.what[1:]}, per head ({int(bf.n_heads)} heads).",
                 "; ".join(model) + ".", "; ".join(where) + "."]  # fmt: skip
        if self.details:
            said = "; ".join(latex_escape(d) for d in self.details)
            lines.append(said[:1].upper() + said[1:] + ".")
        if self.reading:
            lines.append(self.reading)
        return caption_text(lines, "plot")


def model_name(source: str) -> str:
    """The model as a caption names it: the last part of the path or hub name the file records, never the folders
    above it (a user's home folder or an organisation's name would unblind a double-blind submission).

    >>> model_name("/home/someone/runs/alibi/"), model_name("org/gpt2-small"), model_name("/x/code.py:make")
    ('alibi', 'gpt2-small', 'code.py:make')
    """
    return source.strip().rstrip("/").rsplit("/", 1)[-1] or source.strip()


def model_clauses(bf: BiasFile, scheme: str) -> list[str]:
    """'Scheme \\texttt{alibi}', the model (:func:`model_name`) and architecture the file names, how it was trained:
    LaTeX, escaped."""
    model = [f"Scheme \\texttt{{{latex_escape(scheme)}}}"]
    for label, name in (("model", "source_model"), ("architecture", "architecture")):
        text = _file_text(bf, name)
        if text:
            model.append(f"{label} {latex_escape(model_name(text) if name == 'source_model' else text)}")
    note = trained_note(bf.attrs.get("training"))
    model.append(latex_escape(note) if note else "training not recorded in the file")
    return model


def caption_text(lines: Sequence[str], command: str) -> str:
    """The file's text: a comment saying where it came from, then ``\\caption{...}`` of ``lines``."""
    body = "\n  ".join(lines)
    return (f"% written by biasviz {command} --caption; \\input this file inside a figure environment\n"
            f"\\caption{{{body}}}\n")  # fmt: skip


#: The diagnostics figure's rows, in biasviz's own words (README, "Reading the figures and diagnostics").
DIAGNOSTICS_ROWS = (r"context dependence (the bias' spread over inputs), Toeplitz residual (its distance from its "
                    r"mean at each distance $i - j$) and separability residual (from the best $s_i - s_j$), each "
                    r"relative to the head's spread over cells")  # fmt: skip


def diagnostics_caption(entries: Sequence[tuple[str, BiasFile, str]], layer: str | None, sinks: bool) -> str:
    """The caption of ``diagnose``'s figure of every file: ``entries`` (the name drawn, its file, what it was measured
    on: 'T = 512, N = 8'), the layer when every file shares it, whether a sink row is drawn."""
    what = f"Per head and scheme: {DIAGNOSTICS_ROWS}"
    if sinks:
        what += ", and the sink share (the mean attention weight on key 0)"
    lines = [what + r"; on a symmetric-log axis, values below $10^{-6}$ (float rounding) drawn hollow at 0."]
    if layer:
        lines.append(latex_escape(sentence_case(layer)) + ".")
    for name, bf, measured in entries:
        lines.append(f"\\texttt{{{latex_escape(name)}}}: " + "; ".join(model_clauses(bf, bf.scheme)) +
                     f"; {latex_escape(measured)}.")  # fmt: skip
    return caption_text(lines, "diagnose")


def matrix_reading(causal: bool) -> str:
    """How to read a heatmap's axes: query down, key across, and what the grey cells are."""
    masked = " Masked cells ($j > i$) are blank, in a neutral colour that no value maps to." if causal else ""
    return f"Query position $i$ runs down, key position $j$ across.{masked}"


def grid_reading(fig: Figure | SubFigure, causal: bool, kind: str, shared: bool, log: bool = False) -> str:
    """How to read a heatmap grid: its axes, its masked cells and its colour scales, as drawn in ``fig``."""
    return f"{matrix_reading(causal)} {scale_sentence(drawn_scales(fig), shared=shared, log=log, kind=kind)}"


def write_caption(stem: Path, text: str, staged: Staged) -> Path:
    """Stage ``text`` as ``stem.tex`` with the figures of ``stem``: published with them, replaced as they are."""
    target = stem.with_name(f"{stem.name}.tex")
    write_new(staged.temporary(target), text)
    return target


__all__ = [
    "PROFILE_QUANTITIES",
    "QUANTITIES",
    "Caption",
    "caption_text",
    "diagnostics_caption",
    "drawn_scales",
    "grid_reading",
    "latex_escape",
    "matrix_reading",
    "model_clauses",
    "scale_sentence",
    "write_caption",
]
