"""Whether a bias depends on the input, on i - j alone, or on s_i - s_j: the measures of docs/diagnostics.md."""

from biasviz.diagnostics.measures import NORMALIZATIONS, HeadDiagnostics, diagnose_array, diagnose_head

__all__ = ["NORMALIZATIONS", "HeadDiagnostics", "diagnose_array", "diagnose_head"]
