"""The plot job: one file's figures of one kind, drawn with every check ``biasviz plot`` makes, each handed to a
sink with its file stem, LaTeX caption and metadata; ``biasviz plot`` saves them there, ``biasviz.plot`` keeps them.
The runners at the end are the rows of :mod:`biasviz.plotting.kinds` that draw from any file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from biasviz.common.errors import BiasvizError
from biasviz.common.names import display_name
from biasviz.common.terminal import say
from biasviz.plotting.plot_checks import check_scheme, kinds_held
from biasviz.store.datasets import map_name, profile_name

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from biasviz.store import BiasFile

#: Where a job hands each figure: ``sink(fig, stem, formats, caption, options)`` -> the files written (none when it
#: keeps the figure); ``options`` are :func:`biasviz.plotting.save.save_figure`'s keywords (dpi, info, style).
Sink = Callable[["Figure", Path, list[str], "str | None", dict[str, Any]], list[Path]]


@dataclass
class PlotJob:
    """Loads each kind from the file, draws the grid and hands it to the sink with provenance metadata."""

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
    sink: Sink
    step: int | None = None
    sample_given: bool = False  # --sample was given (command line or config), not left at its default

    def _save(self, fig: Figure, stem: Path, formats: list[str], caption: str | None = None,
              **options: Any) -> list[Path]:  # fmt: skip
        """Hand ``fig`` to the sink, with the stem, formats, LaTeX caption and save options it is written with."""
        return self.sink(fig, stem, formats, caption, options)

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
                           dpi=dpi, info=info, style=self.style)  # fmt: skip

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
                say("note", "this file stores the bias in key-position form (it differs from the i - j form by "
                    "a per-row constant); --normalize diagonal shows it relative to the diagonal")
            for kind in kinds:
                if what == "profile":
                    written += self._draw_profile(bf, kind, layer, out_dir, formats, dpi)
                else:
                    written += self._draw(bf, kind, layer, out_dir, formats, dpi, std=what == "std")
            if what == "profile":  # a summary's P(d) and the entropy of its weights
                from biasviz.plotting.position_kinds import summary_profiles

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
            say("note", f"the {kind} is the same for every sample: its standard deviation is 0 everywhere")
        suptitle = file_title(bf, f"{scheme_title(self.scheme)} {kind}", heads.layer, which, details)
        note = suptitle.split(": ", 1)[1]
        log = self.log_scale and kind == "weights"
        shared = log if self.shared_scale is None else self.shared_scale  # a log scale reads best as one
        causal = bf.layer_causal(heads.layer)  # the layer's own rule (an encoder-decoder's calls differ)
        fig = head_grid(heads, kind=panel_kind, shared_scale=shared, cmap=self.cmap,
                        log=log, style=self.style, causal=causal, suptitle=suptitle)  # fmt: skip
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
                          [d for d in details if d], grid_reading(fig, causal, panel_kind, shared, log))  # fmt: skip
        return self._save(fig, out_dir / stem, formats, caption.latex(bf), dpi=dpi, info=info, style=self.style)

    def _draw_profile(self, bf: BiasFile, kind: str, layer: int, out_dir: Path, formats: list[str],
                      dpi: int) -> list[Path]:  # fmt: skip
        from biasviz.plotting.caption import PROFILE_QUANTITIES, Caption
        from biasviz.plotting.diagnostics_plots import PALETTE, profile_grid
        from biasviz.plotting.profiles import YLABELS, as_heads, file_profiles, profile_note
        from biasviz.plotting.titles import file_title, samples_text, scheme_title

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
                           info=info, style=self.style)  # fmt: skip


def run_matrices(job: PlotJob, kind: str, out_dir: Path, formats: list[str], dpi: int) -> list[Path]:
    """``bias``, ``weights`` and ``all`` (both): each head's matrix."""
    return job.run(["bias", "weights"] if kind == "all" else [kind], out_dir, formats, dpi)


def run_over_samples(job: PlotJob, kind: str, out_dir: Path, formats: list[str], dpi: int) -> list[Path]:
    """``profile`` and ``std``: the bias and the weights over all samples, by distance or per cell."""
    return job.run(["bias", "weights"], out_dir, formats, dpi, what=kind)


def run_dynamics(job: PlotJob, kind: str, out_dir: Path, formats: list[str], dpi: int) -> list[Path]:
    """``dynamics``: each head's distance profile at every checkpoint of a sweep."""
    return job.run_dynamics(out_dir, formats, dpi)
