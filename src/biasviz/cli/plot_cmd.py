"""``biasviz plot``: the per-head grid of a file's bias or attention weights (README, "What it makes")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from biasviz.cli.options import NonEmptyPath, config_option, figure_output_options, with_config
from biasviz.cli.plot_options import check_scheme, fit_to_kind, kinds_held, parse_sample, recorded_scheme
from biasviz.common.errors import BiasvizError
from biasviz.common.names import display_name
from biasviz.common.outputs import file_stem
from biasviz.common.terminal import say
from biasviz.plotting.kinds import kind_help, kind_names, runner

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from biasviz.common.atomic import Staged
    from biasviz.store import BiasFile


#: ``ctx.meta`` key of a list that takes the figures (with the style they are saved in) instead of files: biasviz.plot
KEEP_FIGURES = "biasviz.keep_figures"


class KindChoice(click.Choice):
    """``--kind``'s choice: the rows of the kinds table, read when the option is checked or shown."""

    def __init__(self) -> None:
        super().__init__(kind_names())

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        return kind_names()

    @choices.setter
    def choices(self, value: object) -> None:  # click's __init__ sets it; the table stays the source
        pass


@click.command("plot")
@config_option
@click.option(
    "--scheme", default=None,
    help="Scheme name (aliases work), or the name a file records; names the input and output files.  [default: "
         "the one --input records]",
)  # fmt: skip
@click.option(
    "--input",
    "input_path",
    type=NonEmptyPath(dir_okay=False, path_type=Path),
    default=None,
    help="HDF5 file from 'biasviz extract'.  [default: data/<scheme>.h5]",
)
@click.option(
    "--kind",
    type=KindChoice(),
    default="bias",
    show_default=True,
    help=kind_help(),
)
@click.option(
    "--step", type=int, default=None,
    help="In a sweep file: the training step whose checkpoint to draw  [default: the last].",
)
@click.option("--layer", type=int, default=-1, show_default=True, help="Layer index; -1 is the last stored.")
@click.option(
    "--sample",
    "sample_text",
    default="0",
    show_default=True,
    help="Sample index K, or 'mean' for the mean over all samples (streamed). A summary file "
    "('extract --summary') holds the mean only.",
)
@click.option(
    "--normalize",
    type=click.Choice(["none", "diagonal"]),
    default="none",
    show_default=True,
    help="'diagonal' subtracts each row's diagonal value from the bias: biases that differ by a "
    "per-row constant (equivalent under softmax) then look the same.",
)
@click.option("--shared-scale/--per-head-scale", default=None,
              help="One colour scale (and colorbar) for all heads, or one per head.  [default: shared for weights "
                   "on a log scale, per head otherwise]")  # fmt: skip
@click.option(
    "--cmap",
    default=None,
    help="Colormap (matplotlib or seaborn name).  [default: viridis for the "
    "bias, magma for weights, RdBu_r when values change sign]",
)
@click.option("--log", "log_scale", is_flag=True, help="Logarithmic colour scale for the attention weights.")
@click.option("--log-distance", is_flag=True,
              help="With --kind profile or dynamics: a logarithmic distance axis (short-range structure, such as "
                   "T5's exact buckets, gets room).")  # fmt: skip
@click.option(
    "--reduce",
    "reduce_how",
    type=click.Choice(["mean", "max"]),
    default="mean",
    show_default=True,
    help="Block reduction for matrices larger than --max-cells per axis.",
)
@click.option(
    "--max-cells",
    type=click.IntRange(16, 10_000),
    default=None,
    help="Largest matrix drawn cell for cell; larger ones are block-reduced first.  [default: as many cells as a "
    "panel has pixels at --dpi (and at 300 dpi in PDF/SVG), so no cell is dropped]",
)
@click.option("--caption", is_flag=True,
              help="Also write <figure>.tex beside each figure: a LaTeX \\caption{...} saying what it shows, from the "
                   "file (replaced as the figures are).")  # fmt: skip
@figure_output_options
@click.option("--force", is_flag=True,
              help="Overwrite figure files that exist (never one of the input files); without it an existing file "
                   "is an error and nothing is written.")  # fmt: skip
def plot(scheme: str | None, input_path: Path | None, kind: str, step: int | None, layer: int, sample_text: str,
         normalize: str, shared_scale: bool | None, cmap: str | None, log_scale: bool, log_distance: bool,
         formats_text: str, style: str, width: str | None, dpi: int, reduce_how: str, max_cells: int | None,
         out_dir: Path, caption: bool = False, force: bool = False) -> None:  # fmt: skip
    """Draw one panel per head (4 x 3 for 12 heads), as in Figures 10-14 of the CABLE paper.

    Writes OUT_DIR/<scheme>_bias.pdf/.png (and <scheme>_weights.* for --kind weights|all); an existing file
    is replaced only with --force.
    """
    from biasviz.plotting.save import parse_formats
    from biasviz.schemes import canonical_name

    if scheme is None:
        if input_path is None:
            raise click.UsageError("give --scheme, --input or both (--input alone: the scheme it records)")
        scheme = recorded_scheme(input_path)
    try:
        name = canonical_name(scheme)
    except BiasvizError:
        # a name the registry does not know is fine where the file holds it (a traced model's) and it can name a file
        name = scheme.strip()
        if not (input_path or Path("data") / f"{name}.h5").is_file() or file_stem(name) != name:
            raise
    from biasviz.plotting.style import with_width

    style = with_width(style, width)
    sample = parse_sample(sample_text)
    ctx = click.get_current_context()
    sample_given = ctx.get_parameter_source("sample_text") != ParameterSource.DEFAULT
    formats = parse_formats(formats_text)
    normalize, log_scale, log_distance, sample_given = fit_to_kind(ctx, kind, normalize, log_scale, log_distance,
                                                                   sample, sample_given)  # fmt: skip
    from biasviz.common.atomic import replacing_together

    path = input_path or Path("data") / f"{name}.h5"
    # the figure set is written whole or not at all, and over existing files only with --force
    with replacing_together(with_config(path), overwrite=force) as staged:
        job = _PlotJob(scheme=name, path=path, layer=layer, sample=sample, normalize=normalize,
                       shared_scale=shared_scale, cmap=cmap, log_scale=log_scale, log_distance=log_distance,
                       style=style, reduce_how=reduce_how,
                       max_cells=max_cells, staged=staged, step=step, sample_given=sample_given,
                       keep=ctx.meta.get(KEEP_FIGURES), caption=caption)  # fmt: skip
        written = runner(kind)(job, kind, out_dir, formats, dpi)  # the kind's row of biasviz.plotting.kinds
    for path in written:
        click.echo(f"wrote {path}")


@dataclass
class _PlotJob:
    """Loads each kind from the file, draws the grid and saves it with provenance metadata."""

    scheme: str
    path: Path
    layer: int
    sample: int | str
    normalize: str
    shared_scale: bool | None
    cmap: str | None
    log_scale: bool
    log_distance: bool
    style: str
    reduce_how: str
    max_cells: int | None
    staged: Staged | None = None
    step: int | None = None
    sample_given: bool = False  # --sample was given (command line or config), not left at its default
    keep: list[tuple[Figure, str | None]] | None = None  # Python's biasviz.plot: the figures, not files
    caption: bool = False  # --caption: <stem>.tex beside the figures

    def _save(self, fig: Figure, stem: Path, formats: list[str], caption: str | None = None,
              **options: Any) -> list[Path]:  # fmt: skip
        """Save ``fig`` (and, with --caption, its LaTeX caption as ``stem.tex``), or keep it with its style for
        ``biasviz.plot``: Python gets the figure the command writes, its caption as ``fig.biasviz_caption``."""
        from biasviz.plotting.caption import write_caption
        from biasviz.plotting.save import save_figure
        from biasviz.plotting.style import DEFAULT_STYLE

        if self.keep is not None:
            fig.biasviz_caption = caption  # type: ignore[attr-defined]
            self.keep.append((fig, options.get("style", DEFAULT_STYLE)))
            return []
        written = save_figure(fig, stem, formats, **options)
        if self.caption and caption is not None and self.staged is not None:
            written.append(write_caption(stem, caption, self.staged))
        return written

    def _open(self) -> BiasFile:
        """The file, showing the checkpoint of ``--step`` in a sweep (the last by default)."""
        from biasviz.store import open_bias_file

        bf = open_bias_file(self.path, isolated=True)
        if self.step is None:
            return bf
        steps = bf.checkpoints
        if steps is None or self.step not in steps:
            bf.close()
            held = "it is not a sweep" if steps is None else f"it holds steps {', '.join(map(str, steps))}"
            raise BiasvizError(f"--step {self.step}: {held}")
        return bf.at_checkpoint(steps.index(self.step))

    def run_dynamics(self, out_dir: Path, formats: list[str], dpi: int) -> list[Path]:
        from biasviz.diagnostics.measures import diagnose_sweep
        from biasviz.diagnostics.stored import stored_sweep
        from biasviz.plotting.caption import PROFILE_QUANTITIES, Caption
        from biasviz.plotting.dynamics import dynamics_grid, sweep_title

        with self._open() as bf:
            self._check_scheme(bf.scheme)
            if bf.checkpoints is None:
                raise BiasvizError(f"--kind dynamics needs a sweep file ('biasviz extract --checkpoints'); {self.path} "
                                   "holds one checkpoint")  # fmt: skip
            layer = bf.resolve_layer(self.layer)
            if not bf.has_bias(layer):
                raise BiasvizError(f"scheme '{bf.scheme}' adds no bias, so {self.path} has no distance profile to draw")
            if bf.is_summary and self.normalize != "none":
                raise BiasvizError(f"{self.path} is a summary file: its profiles were computed at extraction "
                                   "without normalization; drop --normalize")  # fmt: skip
            sweep = stored_sweep(bf, layer) if bf.is_summary else diagnose_sweep(bf, layer, self.normalize)
            title = sweep_title(bf, layer, self.scheme)
            steps = ", ".join(str(s) for s, _ in sweep)
            caption = Caption(self.scheme, PROFILE_QUANTITIES["dynamics"], layer, f"steps {steps}").latex(bf)
        info = {"title": f"{self.scheme} bias against distance over training (layer {layer})",
                "description": f"mean b(d) over samples and cells with i - j = d at steps {steps}; "
                               f"source: {self.path}",
                "source": display_name(self.path),
                "keywords": f"biasviz; scheme={self.scheme}; kind=dynamics; layer={layer}"}  # fmt: skip
        fig = dynamics_grid(sweep, style=self.style, log_distance=self.log_distance, title=title)
        return self._save(fig, out_dir / f"{self.scheme}_dynamics", formats, caption,
                           dpi=dpi, info=info, style=self.style, staged=self.staged)  # fmt: skip

    def run(self, kinds: list[str], out_dir: Path, formats: list[str], dpi: int, what: str = "matrix") -> list[Path]:
        """Draw each of ``kinds``: its matrices (``what`` 'matrix'), per-cell std maps ('std') or profiles."""
        written: list[Path] = []
        with self._open() as bf:
            self._check_scheme(bf.scheme)
            layer = bf.resolve_layer(self.layer)
            if bf.checkpoints is not None and self.step is None:
                say("note", f"{self.path} is a sweep of {len(bf.checkpoints)} checkpoints; drawing the last "
                    f"(step {bf.step}); --step chooses another, --kind dynamics shows them all")  # fmt: skip
            if bf.is_summary and self.sample_given and self.sample != "mean":
                raise bf.not_per_sample(f"sample {self.sample} (drop --sample to draw the mean)")
            if what == "std" and bf.n_samples < 2:
                held = "the scheme's formula only (--bias-only)" if bf.bias_only else f"{bf.n_samples} sample"
                raise BiasvizError(f"--kind std shows the spread over samples; {self.path} holds {held}")
            kinds = self._kinds_held(bf, kinds, layer, what)
            if bf.attrs.get("bias_convention") == "key-position" and self.normalize == "none" and "bias" in kinds:
                click.echo(
                    "note: this file stores the bias in key-position form (it differs from the i - j form by "
                    "a per-row constant); --normalize diagonal shows it relative to the diagonal",
                    err=True,
                )
            for kind in kinds:
                if what == "profile":
                    written += self._draw_profile(bf, kind, layer, out_dir, formats, dpi)
                else:
                    written += self._draw(bf, kind, layer, out_dir, formats, dpi, std=what == "std")
            if what == "profile":  # a summary's P(d) and the entropy of its weights
                from biasviz.cli.plot_position import summary_profiles

                written += summary_profiles(self, bf, layer, out_dir, formats, dpi)
        return written

    def _kinds_held(self, bf: BiasFile, kinds: list[str], layer: int, what: str) -> list[str]:
        return kinds_held(bf, kinds, layer, what, self.path)

    def _check_scheme(self, stored: str) -> None:
        check_scheme(stored, self.scheme, self.path)

    def _draw(self, bf: BiasFile, kind: str, layer: int, out_dir: Path, formats: list[str], dpi: int,
              std: bool = False) -> list[Path]:  # fmt: skip
        import numpy as np

        from biasviz.plotting.caption import QUANTITIES, Caption, grid_reading
        from biasviz.plotting.heatmap import head_grid, panel_cells
        from biasviz.plotting.load import load_heads, load_summary_heads
        from biasviz.plotting.profiles import blocks_note, samples_phrase
        from biasviz.plotting.titles import file_title, samples_text, scheme_title, which_sample
        from biasviz.store.datasets import map_name

        normalize = self.normalize if kind == "bias" else "none"
        cells = self.max_cells or panel_cells(self.style, dpi, bf.n_heads)
        panel_kind = map_name(kind, "std") if std else kind
        stem = f"{self.scheme}_{kind}_std" if std else f"{self.scheme}_{kind}"
        which = f"per-cell standard deviation over {samples_phrase(bf)}" if std else None  # None: the mean
        details: list[str | None] = []
        if bf.is_summary:
            heads = load_summary_heads(bf, map_name(kind, "std" if std else "mean"), layer=layer, normalize=normalize,
                                       reduce=self.reduce_how, max_cells=cells)  # fmt: skip
            details.append(blocks_note(bf, "std" if std else "mean"))
        else:
            heads = load_heads(bf, kind, layer=layer, sample="std" if std else self.sample, normalize=normalize,
                               reduce=self.reduce_how, max_cells=cells)  # fmt: skip
            if not std and heads.sample != "mean":
                which = which_sample(bf, kind, int(heads.sample))
        if std and not np.nan_to_num(heads.data).any():
            click.echo(f"note: the {kind} is the same for every sample: its standard deviation is 0 everywhere",
                       err=True)  # fmt: skip
        suptitle = file_title(bf, f"{scheme_title(self.scheme)} {kind}", heads.layer, which, details)
        note = suptitle.split(": ", 1)[1]
        log = self.log_scale and kind == "weights"
        shared = log if self.shared_scale is None else self.shared_scale  # a log scale reads best as one
        fig = head_grid(heads, kind=panel_kind, shared_scale=shared, cmap=self.cmap,
                        log=log, style=self.style, causal=bf.causal,
                        suptitle=suptitle)  # fmt: skip
        reduction = heads.reduction.describe()
        if bf.is_summary:
            reduction = f"summary in blocks of {heads.block} positions; drawn: {reduction.replace('cells', 'blocks')}"
        sample = "std" if std else heads.sample
        what = f"{self.scheme} {panel_kind}, layer {heads.layer}, sample {sample}, normalize {normalize}"
        info = {
            "title": f"{self.scheme} {panel_kind} (layer {heads.layer}, sample {sample})",
            "description": f"{what}; {note or 'one sample'}; reduction: {reduction}; source: {self.path}",
            "source": display_name(self.path),
            "keywords": (f"biasviz; scheme={self.scheme}; kind={panel_kind}; layer={heads.layer}; sample={sample}; "
                         f"normalize={normalize}; reduction={reduction}; source={self.path}"),
        }  # fmt: skip
        if normalize == "diagonal":
            details.append("each row relative to its value on the diagonal (--normalize diagonal)")
        if heads.reduction.factor > 1:
            details.append(f"drawn as {heads.reduction.how}s of {heads.reduction.factor} × {heads.reduction.factor} "
                           f"{'blocks' if bf.is_summary else 'cells'} (--max-cells)")  # fmt: skip
        caption = Caption(self.scheme, QUANTITIES[panel_kind], heads.layer, which or samples_text(bf.n_samples),
                          [d for d in details if d], grid_reading(fig, bf.causal, panel_kind, shared, log))  # fmt: skip
        return self._save(fig, out_dir / stem, formats, caption.latex(bf), dpi=dpi, info=info, staged=self.staged)

    def _draw_profile(self, bf: BiasFile, kind: str, layer: int, out_dir: Path, formats: list[str],
                      dpi: int) -> list[Path]:  # fmt: skip
        from biasviz.plotting.caption import PROFILE_QUANTITIES, Caption
        from biasviz.plotting.diagnostics_plots import PALETTE, profile_grid
        from biasviz.plotting.profiles import YLABELS, as_heads, file_profiles, profile_note
        from biasviz.plotting.titles import file_title, samples_text, scheme_title
        from biasviz.store.datasets import profile_name

        normalize = self.normalize if kind == "bias" else "none"
        profiles = file_profiles(bf, kind, layer, normalize)
        over = profile_note(bf.n_samples, bf.bias_only)
        title = file_title(bf, f"{scheme_title(self.scheme)} {kind} by distance", layer, which=over)
        fig = profile_grid(as_heads(profiles), style=self.style, color=PALETTE[0 if kind == "bias" else 5],
                           ylabel=YLABELS[kind], suptitle=title, start=profiles.start,
                           log=self.log_scale and kind == "weights", log_distance=self.log_distance,
                           nonnegative=kind == "weights")  # fmt: skip
        info = {"title": f"{self.scheme} {kind} against distance (layer {layer})", "source": display_name(self.path),
                "description": f"{over} (population std); normalize {normalize}; source: {self.path}",
                "keywords": f"biasviz; scheme={self.scheme}; kind={profile_name(kind)}; layer={layer}"}  # fmt: skip
        which = samples_text(bf.n_samples, bias_only=bf.bias_only)
        caption = Caption(self.scheme, PROFILE_QUANTITIES[kind], layer, which)
        return self._save(fig, out_dir / f"{self.scheme}_{kind}_profile", formats, caption.latex(bf), dpi=dpi,
                           info=info, style=self.style, staged=self.staged)  # fmt: skip


def run_matrices(job: _PlotJob, kind: str, out_dir: Path, formats: list[str], dpi: int) -> list[Path]:
    """``bias``, ``weights`` and ``all`` (both): each head's matrix."""
    return job.run(["bias", "weights"] if kind == "all" else [kind], out_dir, formats, dpi)


def run_over_samples(job: _PlotJob, kind: str, out_dir: Path, formats: list[str], dpi: int) -> list[Path]:
    """``profile`` and ``std``: the bias and the weights over all samples, by distance or per cell."""
    return job.run(["bias", "weights"], out_dir, formats, dpi, what=kind)


def run_dynamics(job: _PlotJob, kind: str, out_dir: Path, formats: list[str], dpi: int) -> list[Path]:
    """``dynamics``: each head's distance profile at every checkpoint of a sweep."""
    return job.run_dynamics(out_dir, formats, dpi)
