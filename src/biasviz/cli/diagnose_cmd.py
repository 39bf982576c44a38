"""``biasviz diagnose``: context-independence metrics per scheme and head (README), as JSON and figures."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from biasviz.cli.options import NonEmptyPath, config_option, figure_output_options, with_config
from biasviz.common.errors import BiasvizError, UsageError, os_error_message
from biasviz.common.names import display_name, utf8_data
from biasviz.common.outputs import check_output_file, file_stem
from biasviz.common.terminal import say

if TYPE_CHECKING:
    from biasviz.common.atomic import Staged
    from biasviz.diagnostics.measures import HeadDiagnostics

DEFINITIONS = ("README, Reading the figures and diagnostics; over the causal cells j <= i; "
               "population standard deviations (ddof=0); "
               "context_dependence is null with fewer than 2 samples; a constant mean bias gives 0; "
               "measures (docs/position-measures.md): mean, std over samples and se = "
               "sqrt(sum (x_a - mean)^2 / (N (N - 1))), the delete-one jackknife, with 3 samples or more")  # fmt: skip


@dataclass
class _FileResult:
    name: str
    scheme: str
    path: Path
    layer: int
    samples: int
    seq_len: int
    context_dependent: bool | None
    heads: list[HeadDiagnostics]  # of the last checkpoint in a sweep file
    sweep: list[tuple[int, list[HeadDiagnostics]]] | None = None  # (step, heads) of every checkpoint
    block: int | None = None  # a summary file's block size (its diagnostics were stored at extraction)
    resolution: int | None = None
    bias_only: bool = False
    positional: list[HeadDiagnostics] | None = None  # P's measures per head (docs/positional.md), where stored
    sinks: dict[str, object] | None = None
    measures: dict[str, object] | None = None  # docs/position-measures.md, with standard errors, where stored
    trained: str | None = None  # how biasviz trained the model, where the file says (drawn as text)
    n_layers: int | None = None  # how many layers the model has (titles say 'final layer, 12 of 12')
    made_by: str | None = None  # a traced model's: the module that made the call (titles say 'attention call 3 of 4')

    def measured_on(self) -> str:
        """'T = 512, N = 8': the length and number of samples the numbers were measured on, for the figures (and
        how biasviz trained the model, where the file says)."""
        said = f"T = {self.seq_len}, " + ("bias only" if self.bias_only else f"N = {self.samples}")
        return said + (f", {self.trained}" if self.trained else "")

    def as_json(self, normalize: str) -> dict[str, object]:
        doc: dict[str, object] = {
            "heads": [h.as_json() for h in self.heads], "scheme": self.scheme, "layer": self.layer,
            "samples": self.samples, "seq_len": self.seq_len, "context_dependent": self.context_dependent,
            "normalize": normalize, "source": display_name(self.path), "summary": self.block is not None}  # fmt: skip
        if self.block is not None:  # read from the file, as extract --summary computed them at full resolution
            doc.update(resolution=self.resolution, block=self.block)
        if self.positional is not None:
            doc["positional"] = {"heads": [h.as_json() for h in self.positional]}
        if self.sinks is not None:
            doc["sinks"] = self.sinks
        if self.measures is not None:
            doc["measures"] = self.measures
        if self.sweep is not None:
            doc["checkpoints"] = [{"step": step, "heads": [h.as_json() for h in heads]} for step, heads in self.sweep]
        return doc


@click.command("diagnose")
@config_option
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--json",
    "json_path",
    type=NonEmptyPath(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the metrics.  [default: <out-dir>/diagnostics.json]",
)
@click.option("--layer", type=int, default=-1, show_default=True, help="Layer index; -1 is the last stored.")
@click.option(
    "--normalize",
    type=click.Choice(["none", "diagonal"]),
    default="none",
    show_default=True,
    help="'diagonal' subtracts each row's diagonal value first (for biases stored up to a per-row constant).",
)
@figure_output_options
@click.option("--caption", is_flag=True,
              help="Also write <figure>.tex beside each figure: a LaTeX \\caption{...} saying what it shows, from the "
                   "files (replaced as the figures are).")  # fmt: skip
@click.option("--no-figures", is_flag=True, help="Write the JSON only.")  # fmt: skip
@click.option("--force", is_flag=True, help="Overwrite an existing JSON file (never one of the input files).")
def diagnose(files: tuple[Path, ...], json_path: Path | None, out_dir: Path, layer: int, normalize: str,
             formats_text: str, style: str, width: str | None, dpi: int, no_figures: bool,
             force: bool, caption: bool = False) -> None:  # fmt: skip
    """Measure how much each head's bias depends on the input and on more than i - j.

    Writes the metrics per scheme and head to JSON, OUT_DIR/diagnostics.pdf/.png (all schemes side by
    side) and OUT_DIR/<scheme>_bias_profile.pdf/.png (mean bias against distance, with a +-1 std band).
    Files of schemes without a bias (learned, nope) are skipped with a note.
    """
    from biasviz.common.atomic import replacing_together
    from biasviz.plotting.save import parse_formats
    from biasviz.plotting.style import with_width

    formats = parse_formats(formats_text)
    if no_figures:
        _refuse_figure_options()
    style = with_width(style, width)
    target = json_path or out_dir / "diagnostics.json"
    option = "--json" if json_path else "--out-dir"
    check_output_file(target, with_config(*files), force, option)
    results = [r for r in (_diagnose_file(p, layer, normalize) for p in files) if r is not None]
    if not results:
        raise BiasvizError("none of the files holds a bias; nothing to diagnose")
    _name_uniquely(results)
    # the JSON and the figures are replaced together, or not at all; never over an input
    with replacing_together(with_config(*files)) as staged:
        _write_json(staged.temporary(target, overwrite=force, option=option), results, normalize, target)
        written = [target] + ([] if no_figures else _draw(results, out_dir, formats, style, dpi, staged, caption))
    for path in written:
        click.echo(f"wrote {path}")


def _refuse_figure_options() -> None:
    """--format, --style and --dpi given on the command line with --no-figures would have no effect."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = [f"--{name}" for name, param in (("format", "formats_text"), ("style", "style"), ("width", "width"),
                                             ("dpi", "dpi"), ("caption", "caption"))
             if ctx.get_parameter_source(param) == ParameterSource.COMMANDLINE]  # fmt: skip
    if given:
        raise UsageError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for the figures, and --no-figures "
                         "draws none; drop one or the other")  # fmt: skip


def _diagnose_file(path: Path, layer: int, normalize: str) -> _FileResult | None:
    from biasviz.diagnostics.measures import diagnose_dataset, diagnose_sweep
    from biasviz.diagnostics.stored import stored_heads, stored_measures, stored_position, stored_sweep
    from biasviz.plotting.titles import made_by, trained_text
    from biasviz.store import open_bias_file

    with open_bias_file(path, isolated=True) as bf:
        resolved = bf.resolve_layer(layer)
        positional, sinks = stored_position(bf, resolved)
        measures = stored_measures(bf, resolved)
        if not bf.has_bias(resolved):
            if positional is None and sinks is None:
                say("note", f"skipped {path}: scheme '{bf.scheme}' adds no bias (extract --summary with two "
                    "samples or more measures its positional logits)")  # fmt: skip
                return None
            return _FileResult(name=bf.scheme, scheme=bf.scheme, path=path, layer=resolved, samples=bf.n_samples,
                               seq_len=bf.seq_len, context_dependent=None, heads=[], block=bf.block,
                               resolution=bf.resolution, positional=positional, sinks=sinks,
                               measures=measures, trained=trained_text(bf), n_layers=bf.n_layers,
                               made_by=made_by(bf, resolved))  # fmt: skip
        if bf.attrs.get("bias_convention") == "key-position" and normalize == "none":
            say("note", f"{path} stores the bias in key-position form; its Toeplitz residual is not 0 even "
                "for a relative scheme (use --normalize diagonal)")  # fmt: skip
        if bf.is_summary and normalize != "none":
            raise BiasvizError(f"{path} is a summary file: its diagnostics were computed at extraction without "
                               "normalization; drop --normalize, or re-extract without --summary")  # fmt: skip
        try:
            if bf.is_summary:  # read as stored, never recomputed
                sweep = None if bf.checkpoints is None else stored_sweep(bf, resolved)
                heads = sweep[-1][1] if sweep else stored_heads(bf, resolved)
            else:
                sweep = None if bf.checkpoints is None else diagnose_sweep(bf, resolved, normalize)
                if sweep:
                    heads = sweep[-1][1]
                else:  # over the cells the model used: j <= i when causal, every cell when bidirectional
                    heads = list(diagnose_dataset(bf.dataset("bias", resolved), normalize, bf.layer_causal(resolved)))
        except ValueError as exc:  # NaN/inf in used cells: a damaged or hand-made file
            raise BiasvizError(f"{path}: {exc}; the file is damaged; extract it again") from exc
        notes = dict.fromkeys(n.split(": ", 1)[1] for h in heads for n in h.notes)
        for note in notes:
            say("note", f"{path}: {note}")
        return _FileResult(name=bf.scheme, scheme=bf.scheme, path=path, layer=resolved, samples=bf.n_samples,
                           seq_len=bf.seq_len, context_dependent=bf.context_dependence_recorded, heads=heads,
                           sweep=sweep, block=bf.block, resolution=bf.resolution, bias_only=bf.bias_only,
                           positional=positional, sinks=sinks, measures=measures, trained=trained_text(bf),
                           n_layers=bf.n_layers, made_by=made_by(bf, resolved))  # fmt: skip


def _name_uniquely(results: list[_FileResult]) -> None:
    """Key by scheme name; where two files share a scheme, add the file name."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r.scheme] = counts.get(r.scheme, 0) + 1
    for r in results:
        if counts[r.scheme] > 1:
            r.name = f"{r.scheme}-{r.path.stem}" if r.path.stem != r.scheme else f"{r.scheme}-{r.path.parent.name}"
    names = [r.name for r in results]
    stems = [file_stem(n) for n in names]  # the names come from the files: only a safe stem reaches a path
    if len(set(names)) != len(names) or len(set(stems)) != len(stems):
        raise BiasvizError(f"two files give the same name ({', '.join(map(repr, names))}); rename one of them")


def _write_json(tmp: Path, results: list[_FileResult], normalize: str, target: Path) -> None:
    from biasviz.common.atomic import write_new
    from biasviz.common.version import __version__

    doc = {
        "schemes": {r.name: r.as_json(normalize) for r in results},
        "definitions": DEFINITIONS,
        "biasviz_version": __version__,
    }  # fmt: skip
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_new(tmp, json.dumps(utf8_data(doc), indent=2, allow_nan=False) + "\n")
    except OSError as exc:
        raise BiasvizError(os_error_message(exc, target)) from exc


def _draw(results: list[_FileResult], out_dir: Path, formats: list[str], style: str, dpi: int,
          staged: Staged, caption: bool = False) -> list[Path]:  # fmt: skip
    """The figures (and, with ``caption``, each one's LaTeX caption beside it, staged with them)."""
    import numpy as np

    from biasviz.diagnostics.stored import SINK_EPSILON
    from biasviz.plotting.diagnostics_plots import PALETTE, diagnostics_figure, profile_grid
    from biasviz.plotting.profiles import profile_note
    from biasviz.plotting.save import save_figure
    from biasviz.plotting.style import literal
    from biasviz.plotting.titles import figure_title, samples_text, scheme_title

    sources = "; ".join(f"{r.name}={display_name(r.path)}" for r in results)
    info = {"title": "Context-independence diagnostics", "source": sources,
            "description": f"{DEFINITIONS}; sources: {sources}", "keywords": "biasviz; diagnostics"}  # fmt: skip
    layers = {r.layer for r in results}
    one_layer = len(layers) == 1
    details: dict[str, str] = {}
    heads: dict[str, list[HeadDiagnostics]] = {}  # names from files: drawn as text, never math
    sinks: dict[str, list[float]] = {}  # docs/positional.md: each head's share of key 0, in the file's first entry
    for r in results:
        where = ("" if one_layer else f"layer {r.layer}, ") + r.measured_on()
        first = len(heads)
        label = scheme_title(r.name)  # as papers write a scheme (ALiBi), a name of one's own as given
        if r.heads:
            heads[label], details[label] = r.heads, where
        if r.positional:  # docs/positional.md: the positional logits P measured like a bias
            heads[f"{label} P"], details[f"{label} P"] = r.positional, f"positional logits, {where}"
        if r.sinks is not None and len(heads) > first:
            sinks[list(heads)[first]] = list(r.sinks["share_per_head"])  # type: ignore[call-overload]
    title = "Diagnostics per head"
    if one_layer:
        title += ", " + literal(_shared_layer_text(results))
    figure = diagnostics_figure(heads, style=style, details=details, title=title, sinks=sinks,
                                epsilon=SINK_EPSILON)  # fmt: skip
    written = save_figure(figure, out_dir / "diagnostics", formats, dpi=dpi, info=info, style=style, staged=staged)
    if caption:
        written += _captions(results, out_dir, staged, one_layer, bool(sinks))
    for k, r in enumerate(results):
        if not r.heads:  # no bias: its positional logits are drawn by 'biasviz plot --kind profile'
            continue
        flat = all(not np.any(np.nan_to_num(np.asarray(h.profile_std))) for h in r.heads)  # a band of width 0
        suptitle = figure_title(f"{scheme_title(r.name)} bias by distance", layer=r.layer, n_layers=r.n_layers,
                                seq_len=r.seq_len, which=profile_note(r.samples, r.bias_only),
                                details=["std 0 at every distance" if flat else None],
                                trained=literal(r.trained) if r.trained else None, made_by=r.made_by)  # fmt: skip
        fig = profile_grid(r.heads, style=style, color=PALETTE[k % len(PALETTE)], suptitle=suptitle)
        info = {
            "title": f"{r.name} bias against distance (layer {r.layer}, {r.samples} samples)",
            "source": display_name(r.path),
            "keywords": f"biasviz; scheme={r.scheme}; layer={r.layer}",
            "description": f"mean and +-1 population std over samples and cells with i - j = d; source: {r.path}",
        }
        written += save_figure(
            fig, out_dir / f"{file_stem(r.name)}_bias_profile", formats, dpi=dpi, info=info, style=style, staged=staged
        )
        if r.sweep is not None:
            from biasviz.plotting.dynamics import over_training

            info = {"title": f"{r.name} diagnostics over training (layer {r.layer})", "source": display_name(r.path),
                    "keywords": f"biasviz; scheme={r.scheme}; layer={r.layer}; over training",
                    "description": f"context dependence and Toeplitz residual per head at each checkpoint; "
                                   f"source: {r.path}"}  # fmt: skip
            stem = out_dir / f"{file_stem(r.name)}_training"
            title = figure_title(f"{scheme_title(r.name)} diagnostics over training", layer=r.layer,
                                 n_layers=r.n_layers, seq_len=r.seq_len,
                                 which=samples_text(r.samples, bias_only=r.bias_only),
                                 trained=literal(r.trained) if r.trained else None, made_by=r.made_by)  # fmt: skip
            written += save_figure(over_training(r.sweep, style=style, title=title), stem, formats, dpi=dpi, info=info,
                                   style=style, staged=staged)  # fmt: skip
    return written


def _shared_layer_text(results: list[_FileResult]) -> str:
    """The one layer every file's diagnostics were taken at, as figure text counts it: with the model's layer count
    where the files agree on it, and the module that made the call where every file is a traced model's and names
    the same one."""
    from biasviz.plotting.titles import layer_text

    counts, owners = {r.n_layers for r in results}, {r.made_by for r in results}
    return layer_text(results[0].layer, counts.pop() if len(counts) == 1 else None,
                      owners.pop() if len(owners) == 1 else None)


def _captions(results: list[_FileResult], out_dir: Path, staged: Staged, one_layer: bool, sinks: bool) -> list[Path]:
    """``--caption``: diagnostics.tex for the figure of every file, <name>_bias_profile.tex and <name>_training.tex
    beside each file's own figures; every value read from a file escaped (:mod:`biasviz.plotting.caption`)."""
    from biasviz.plotting.caption import PROFILE_QUANTITIES, Caption, diagnostics_caption, write_caption
    from biasviz.plotting.profiles import profile_note
    from biasviz.plotting.titles import samples_text
    from biasviz.store import open_bias_file

    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open_bias_file(r.path)) for r in results]
        layer = _shared_layer_text(results) if one_layer else None
        entries = [(r.name, bf, r.measured_on() if one_layer else f"layer {r.layer}, {r.measured_on()}")
                   for r, bf in zip(results, files, strict=True)]  # fmt: skip
        written = [write_caption(out_dir / "diagnostics", diagnostics_caption(entries, layer, sinks), staged)]
        for r, bf in zip(results, files, strict=True):
            if not r.heads:
                continue
            text = Caption(r.scheme, PROFILE_QUANTITIES["bias"], r.layer, profile_note(r.samples, r.bias_only))
            written.append(write_caption(out_dir / f"{file_stem(r.name)}_bias_profile", text.latex(bf), staged))
            if r.sweep is not None:
                over = Caption(r.scheme, TRAINING_QUANTITY, r.layer, samples_text(r.samples, bias_only=r.bias_only))
                written.append(write_caption(out_dir / f"{file_stem(r.name)}_training", over.latex(bf), staged))
    return written


#: What the figure over training draws (biasviz's own LaTeX).
TRAINING_QUANTITY = (r"context dependence and Toeplitz residual of the bias at each training checkpoint, each relative "
                     r"to the head's spread over cells")  # fmt: skip
