"""Distance profiles read from a file, and the words that say what a summary's figure averages.

``plot --kind profile`` draws, per head, the mean of the bias (or of the attention weights) over samples
and cells with i - j = d, with a band of +-1 standard deviation. A summary file stores these profiles;
for a full file they are computed here, streamed one (sample, head) matrix at a time.
"""

from __future__ import annotations

from biasviz.common.errors import BiasvizError
from biasviz.diagnostics.measures import HeadDiagnostics
from biasviz.diagnostics.profiles import Profiles, dataset_profiles
from biasviz.store import BiasFile

YLABELS = {"bias": "Bias (mean ± 1 std)", "weights": "Attention weight (mean ± 1 std)"}


def file_profiles(bf: BiasFile, kind: str, layer: int, normalize: str = "none") -> Profiles:
    """``kind``'s distance profiles of every head in ``layer``: stored (summary) or computed (full file)."""
    if bf.summary is not None:
        if normalize != "none":
            raise BiasvizError(f"{bf.path} is a summary file: its profiles were computed at extraction without "
                               "normalization; drop --normalize, or re-extract without --summary")  # fmt: skip
        mean, std = bf.profile(kind, layer)
        return Profiles(mean, std, bf.summary.profile_start, bf.n_samples)
    try:
        causal = bf.layer_causal(layer)  # the layer's own rule (an encoder-decoder's calls differ)
        return dataset_profiles(bf.dataset(kind, layer), causal, normalize if kind == "bias" else "none")
    except ValueError as exc:
        raise BiasvizError(f"{bf.path}: the {kind} of layer {layer}: {exc}; the file is damaged or was not "
                           "written by 'biasviz extract'; extract it again") from exc  # fmt: skip


def as_heads(profiles: Profiles) -> list[HeadDiagnostics]:
    """One :class:`HeadDiagnostics` per head carrying only the profile, for :func:`profile_grid`."""
    return [HeadDiagnostics(head=h + 1, samples=profiles.samples, context_dependence=None, toeplitz_residual=None,
                            profile_mean=profiles.mean[h], profile_std=profiles.std[h])
            for h in range(profiles.mean.shape[0])]  # fmt: skip


def samples_phrase(bf: BiasFile) -> str:
    """'64 samples', or what a --bias-only file holds instead."""
    if bf.bias_only:
        return "the scheme's formula (--bias-only, no text)"
    n = bf.n_samples
    return f"{n} sample{'s' * (n != 1)}"


def profile_note(n_samples: int, bias_only: bool) -> str:
    """What a distance profile's line and band are taken over, for the line above its panels."""
    if bias_only:
        return "mean ± 1 std over the cells at each distance (the scheme's formula, --bias-only)"
    return f"mean ± 1 std over {n_samples} sample{'s' * (n_samples != 1)} and the cells at each distance"


def blocks_note(bf: BiasFile, what: str = "mean") -> str | None:
    """What a summary's cells are, for its title: 'block means of 16 × 16 positions' (``what`` 'std': 'in blocks
    of ...'), None where each cell is one position."""
    block = bf.block or 1
    if block == 1:
        return None
    return f"{'block means of' if what == 'mean' else 'in blocks of'} {block} × {block} positions"


__all__ = ["YLABELS", "as_heads", "file_profiles", "profile_note", "samples_phrase", "blocks_note"]
