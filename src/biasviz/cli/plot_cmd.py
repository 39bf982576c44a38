"""``biasviz plot``: the per-head grid of a file's bias or attention weights (README, "What it makes").

The command parses its options and saves; what it draws and every check of the values is the library's
(:mod:`biasviz.plotting.draw`, whose :func:`~biasviz.plotting.draw.figures` ``biasviz.plot`` calls).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from biasviz.cli.options import config_option, figure_output_options, with_config
from biasviz.plotting.kinds import kind_help, runner
from biasviz.plotting.options import INPUT, KIND, OPTIONS, option

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from biasviz.common.atomic import Staged
    from biasviz.plotting.job import Sink


@click.command("plot")
@config_option
@click.option(
    "--scheme", default=None,
    help="Scheme name (aliases work), or the name a file records; names the input and output files.  [default: "
         "the one --input records]",
)  # fmt: skip
@option(
    INPUT,
    "input_path",
    default=None,
    help="HDF5 file from 'biasviz extract'.  [default: data/<scheme>.h5]",
)
@option(
    KIND,
    default="bias",
    show_default=True,
    help=kind_help(),
)
@option(
    OPTIONS["step"],
    default=None,
    help="In a sweep file: the training step whose checkpoint to draw  [default: the last].",
)
@option(OPTIONS["layer"], default=-1, show_default=True, help="Layer index; -1 is the last stored.")
@option(
    OPTIONS["sample"],
    "sample_text",
    default="0",
    show_default=True,
    help="Sample index K, or 'mean' for the mean over all samples (streamed). A summary file "
    "('extract --summary') holds the mean only.",
)
@option(
    OPTIONS["normalize"],
    default="none",
    show_default=True,
    help="'diagonal' subtracts each row's diagonal value from the bias: biases that differ by a "
    "per-row constant (equivalent under softmax) then look the same.",
)
@click.option("--shared-scale/--per-head-scale", default=None,
              help="One colour scale (and colorbar) for all heads, or one per head.  [default: shared for weights "
                   "on a log scale, per head otherwise]")  # fmt: skip
@option(
    OPTIONS["cmap"],
    default=None,
    help="Colormap (matplotlib or seaborn name).  [default: viridis for the "
    "bias, magma for weights, RdBu_r when values change sign]",
)
@option(OPTIONS["log"], "log_scale", help="Logarithmic colour scale for the attention weights.")
@option(OPTIONS["log_distance"],
        help="With --kind profile or dynamics: a logarithmic distance axis (short-range structure, such as "
             "T5's exact buckets, gets room).")  # fmt: skip
@option(
    OPTIONS["reduce"],
    "reduce_how",
    default="mean",
    show_default=True,
    help="Block reduction for matrices larger than --max-cells per axis.",
)
@option(
    OPTIONS["max_cells"],
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
    from biasviz.common.atomic import replacing_together
    from biasviz.plotting.draw import plot_scheme
    from biasviz.plotting.job import PlotJob
    from biasviz.plotting.plot_checks import fit_to_kind, parse_sample
    from biasviz.plotting.save import parse_formats
    from biasviz.plotting.style import with_width

    if scheme is None and input_path is None:
        raise click.UsageError("give --scheme, --input or both (--input alone: the scheme it records)")
    name, path = plot_scheme(scheme, input_path)
    style = with_width(style, width)
    sample = parse_sample(sample_text)
    ctx = click.get_current_context()
    sample_given = ctx.get_parameter_source("sample_text") != ParameterSource.DEFAULT
    formats = parse_formats(formats_text)
    params = {
        "normalize": "normalize",
        "log_scale": "log_scale",
        "log_distance": "log_distance",
        "sample": "sample_text",
    }  # fit_to_kind's names -> the parameters': those a config file set
    from_config = {k for k, p in params.items() if ctx.get_parameter_source(p) == ParameterSource.DEFAULT_MAP}
    normalize, log_scale, log_distance, sample_given = fit_to_kind(kind, normalize, log_scale, log_distance, sample,
                                                                   sample_given, from_config)  # fmt: skip
    # the figure set is written whole or not at all, and over existing files only with --force
    with replacing_together(with_config(path), overwrite=force) as staged:
        job = PlotJob(scheme=name, path=path, layer=layer, sample=sample, normalize=normalize,
                      shared_scale=shared_scale, cmap=cmap, log_scale=log_scale, log_distance=log_distance,
                      style=style, reduce_how=reduce_how, max_cells=max_cells, sink=_saving(staged, caption),
                      step=step, sample_given=sample_given)  # fmt: skip
        written = runner(kind)(job, kind, out_dir, formats, dpi)  # the kind's row of biasviz.plotting.kinds
    for path in written:
        click.echo(f"wrote {path}")


def _saving(staged: Staged, caption: bool) -> Sink:
    """The job's sink of the command: each figure saved in the set written together (and, with --caption, its
    LaTeX caption as ``<stem>.tex``)."""
    from biasviz.plotting.caption import write_caption
    from biasviz.plotting.save import save_figure

    def save(fig: Figure, stem: Path, formats: list[str], latex: str | None, options: dict[str, Any]) -> list[Path]:
        written = save_figure(fig, stem, formats, **options, staged=staged)
        if caption and latex is not None:
            written.append(write_caption(stem, latex, staged))
        return written

    return save
