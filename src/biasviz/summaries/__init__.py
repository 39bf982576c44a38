"""Summaries computed where the model runs (docs/hdf5.md, 'Summary files'): per layer, the mean and spread over samples
as block maps, the distance profiles and the diagnostics, streamed over samples and blocks of query rows.

:mod:`.moments` is where samples meet; :mod:`.maps`, :mod:`.diagonals` and :mod:`.measures` keep running sums
of the rows they are given; :mod:`.layer` ties them together for one quantity of one layer; :mod:`.sharing`
measures whether a bias declared the same for every input is.
"""

from biasviz.summaries.layer import MODES, QuantitySummary, Summary

__all__ = ["MODES", "QuantitySummary", "Summary"]
