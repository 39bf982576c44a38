"""The plot kinds of a summary's position datasets: docs/positional.md (the grid of P, its distance profile, the
sinks) and section 14 (band mass, the context U-curve, rotary frequency use, the entropy of the weights), each handed
to the job's sink with its metadata and its LaTeX caption (``biasviz plot`` saves them, ``biasviz.plot`` keeps them)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from biasviz.common.names import display_name

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from biasviz.plotting.caption import Caption
    from biasviz.store import BiasFile


class _PlotJob(Protocol):
    """What these figures read of the plot job (:class:`biasviz.plotting.job.PlotJob`)."""

    scheme: str
    path: Path
    layer: int
    style: str
    shared_scale: bool | None
    cmap: str | None
    log_distance: bool
    max_cells: int | None

    def _open(self) -> BiasFile: ...

    def _check_scheme(self, stored: str) -> None: ...

    def _save(self, fig: Figure, stem: Path, formats: list[str], caption: str | None = None,
              **options: Any) -> list[Path]: ...  # fmt: skip


def run_positional(job: _PlotJob, kind: str, out_dir: Path, formats: list[str], dpi: int) -> list[Path]:
    """The grid of P, relative to each head's P at distance 0 (docs/positional.md)."""
    from biasviz.plotting.caption import QUANTITIES, Caption, grid_reading
    from biasviz.plotting.heatmap import panel_cells
    from biasviz.plotting.positional import positional_grid
    from biasviz.plotting.profiles import blocks_note
    from biasviz.plotting.titles import samples_text, scheme_title

    with _summary(job) as (bf, layer):
        fig = positional_grid(bf, layer, scheme=scheme_title(job.scheme), style=job.style,
                              shared_scale=bool(job.shared_scale), cmap=job.cmap,
                              max_cells=job.max_cells or panel_cells(job.style, dpi, bf.n_heads))  # fmt: skip
        caption = Caption(job.scheme, QUANTITIES["positional"], layer, samples_text(bf.n_samples),
                          [d for d in [blocks_note(bf)] if d],
                          grid_reading(fig, bf.causal, "positional", bool(job.shared_scale)))  # fmt: skip
        return _save_kind(job, bf, kind, layer, fig, caption, out_dir, formats, dpi)


def run_sinks(job: _PlotJob, kind: str, out_dir: Path, formats: list[str], dpi: int) -> list[Path]:
    """Each head's mean weight on the first keys (docs/positional.md)."""
    from biasviz.plotting.caption import PROFILE_QUANTITIES, Caption
    from biasviz.plotting.measures_plots import se_note
    from biasviz.plotting.positional import sinks_figure
    from biasviz.plotting.titles import samples_text, scheme_title

    with _summary(job) as (bf, layer):
        fig = sinks_figure(bf, layer, scheme=scheme_title(job.scheme), style=job.style)
        caption = Caption(job.scheme, PROFILE_QUANTITIES["sinks"], layer, samples_text(bf.n_samples),
                          [se_note(bf, layer, "sinks")])  # fmt: skip
        return _save_kind(job, bf, kind, layer, fig, caption, out_dir, formats, dpi)


def run_measure(job: _PlotJob, kind: str, out_dir: Path, formats: list[str], dpi: int) -> list[Path]:
    """A figure of docs/position-measures.md: the one its row of the kinds table names, with its 95 % band."""
    from biasviz.plotting.caption import PROFILE_QUANTITIES, Caption
    from biasviz.plotting.kinds import plot_kind, resolve
    from biasviz.plotting.measures_plots import se_note
    from biasviz.plotting.titles import samples_text, scheme_title

    draw = resolve(plot_kind(kind).figure)
    with _summary(job) as (bf, layer):
        fig = draw(bf, layer, scheme=scheme_title(job.scheme), style=job.style)
        caption = Caption(job.scheme, PROFILE_QUANTITIES[kind], layer, samples_text(bf.n_samples),
                          [se_note(bf, layer, kind)])  # fmt: skip
        return _save_kind(job, bf, kind, layer, fig, caption, out_dir, formats, dpi)


@contextlib.contextmanager
def _summary(job: _PlotJob) -> Iterator[tuple[BiasFile, int]]:
    """The job's file, its scheme checked, and the layer to draw."""
    with job._open() as bf:
        job._check_scheme(bf.scheme)
        yield bf, bf.resolve_layer(job.layer)


def _save_kind(job: _PlotJob, bf: BiasFile, kind: str, layer: int, fig: Figure, caption: Caption, out_dir: Path,
               formats: list[str], dpi: int) -> list[Path]:  # fmt: skip
    """Save a summary kind's figure as ``<scheme>_<kind>``, its metadata saying what its row of the table does."""
    from biasviz.plotting.kinds import plot_kind

    info = {"title": f"{job.scheme} {kind} (layer {layer})", "source": display_name(job.path),
            "description": f"{plot_kind(kind).about}; over {bf.n_samples} samples; source: {job.path}",
            "keywords": f"biasviz; scheme={job.scheme}; kind={kind}; layer={layer}"}  # fmt: skip
    return job._save(fig, out_dir / f"{job.scheme}_{kind}", formats, caption.latex(bf), dpi=dpi, info=info,
                     style=job.style)  # fmt: skip


def summary_profiles(job: _PlotJob, bf: BiasFile, layer: int, out_dir: Path, formats: list[str],
                     dpi: int) -> list[Path]:  # fmt: skip
    """What ``--kind profile`` adds on a summary that holds it: P(d) beside b(d), and the entropy of the weights."""
    from biasviz.store.datasets import POSITIONAL_PROFILE, WEIGHTS_ENTROPY

    written: list[Path] = []
    if bf.summary is None:
        return written
    if bf.summary.holds(layer, POSITIONAL_PROFILE):
        written += _positional_profile(job, bf, layer, out_dir, formats, dpi)
    if bf.summary.holds(layer, WEIGHTS_ENTROPY):
        written += _entropy(job, bf, layer, out_dir, formats, dpi)
    return written


def _positional_profile(job: _PlotJob, bf: BiasFile, layer: int, out_dir: Path, formats: list[str],
                        dpi: int) -> list[Path]:  # fmt: skip
    from biasviz.plotting.caption import PROFILE_QUANTITIES, Caption
    from biasviz.plotting.positional import positional_profile_figure
    from biasviz.plotting.titles import samples_text, scheme_title
    from biasviz.store.datasets import POSITIONAL_PROFILE

    fig = positional_profile_figure(bf, layer, scheme=scheme_title(job.scheme), style=job.style,
                                    log_distance=job.log_distance)
    info = {"title": f"{job.scheme} positional logits against distance (layer {layer})",
            "source": display_name(job.path),
            "description": f"P(d) over all keys and over keys j >= 4, and b(d); {bf.n_samples} samples; "
                           f"source: {job.path}",
            "keywords": f"biasviz; scheme={job.scheme}; kind={POSITIONAL_PROFILE}; layer={layer}"}  # fmt: skip
    caption = Caption(job.scheme, PROFILE_QUANTITIES["positional"], layer, samples_text(bf.n_samples))
    return job._save(fig, out_dir / f"{job.scheme}_positional_profile", formats, caption.latex(bf), dpi=dpi,
                     info=info, style=job.style)  # fmt: skip


def _entropy(job: _PlotJob, bf: BiasFile, layer: int, out_dir: Path, formats: list[str], dpi: int) -> list[Path]:
    from biasviz.plotting.caption import PROFILE_QUANTITIES, Caption
    from biasviz.plotting.measures_plots import entropy_figure, se_note
    from biasviz.plotting.titles import samples_text, scheme_title

    fig = entropy_figure(bf, layer, scheme=scheme_title(job.scheme), style=job.style)
    info = {"title": f"{job.scheme} entropy of the attention weights by query position (layer {layer})",
            "source": display_name(job.path),
            "description": f"entropy (nats) of each query's weights, block means over {bf.n_samples} samples, with a "
                           f"95% band; source: {job.path}",
            "keywords": f"biasviz; scheme={job.scheme}; kind=entropy; layer={layer}"}  # fmt: skip
    caption = Caption(job.scheme, PROFILE_QUANTITIES["entropy"], layer, samples_text(bf.n_samples),
                      [se_note(bf, layer, "entropy")])  # fmt: skip
    return job._save(fig, out_dir / f"{job.scheme}_entropy", formats, caption.latex(bf), dpi=dpi, info=info,
                     style=job.style)  # fmt: skip
