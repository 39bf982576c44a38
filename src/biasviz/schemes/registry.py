"""The table of positional schemes: what each is, readable without importing torch.

One entry per scheme, in listing order, naming the module and class that implement it; the class is
imported only when a model is built (:func:`scheme_class`). The CLI (``biasviz schemes``, ``plot``,
``diagnose``, ``info``), README's table and the adapters read this table; the scheme classes take
their descriptive attributes from it (:func:`biasviz.schemes.register`), so the two cannot drift.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from biasviz.common.errors import BiasvizError


@dataclass(frozen=True)
class SchemeInfo:
    """What a scheme is: its names, its bias b_h(i, j), its reference, its flags and options."""

    name: str
    module: str  # biasviz.schemes.<module> holds the class
    cls: str
    formula: str
    reference: str
    aliases: tuple[str, ...] = ()
    context_dependent: bool = False  # the bias changes with the input
    adds_bias: bool = True  # False: no additive bias (learned absolute positions, NoPE)
    absolute_positions: bool = False  # uses learned absolute embeddings (limits the length)
    rotary: bool = False  # turns q and k by their positions (RoPE) instead of adding a bias
    default_options: dict[str, Any] = field(default_factory=dict)


TABLE: tuple[SchemeInfo, ...] = (
    SchemeInfo("alibi", "alibi", "ALiBi", "-m_h * d", "Press, Smith & Lewis, ICLR 2022 (ALiBi)",
               default_options={"slopes": "geometric"}),
    SchemeInfo("kerple-log", "kerple", "KerpleLog", "-r1_h * log(1 + r2_h * d)", "Chi et al., NeurIPS 2022 (KERPLE)",
               aliases=("kerple",)),
    SchemeInfo("kerple-power", "kerple", "KerplePower", "-r1_h * d^r2_h", "Chi et al., NeurIPS 2022 (KERPLE)"),
    SchemeInfo("fire", "fire", "FIRE", "f(psi(d) / psi(max(L, i)))_h, psi(x) = log(c*x + 1)",
               "Li et al., ICLR 2024 (FIRE)", default_options={"hidden": 32, "init_c": 0.1, "init_threshold": 512.0}),
    SchemeInfo("t5", "t5", "T5Bias", "w[bucket(d), h]", "Raffel et al., JMLR 2020 (T5)", aliases=("t5-bias",),
               default_options={"num_buckets": 32, "max_distance": 128}),
    SchemeInfo("cable", "cable", "CABLE", "-sum_{k=j+1..i} softplus(w_h . x_k + beta_h)",
               'Veisi et al., "Context-aware Biases for Length Extrapolation" (CABLE)', context_dependent=True),
    SchemeInfo("fox", "fox", "FoX", "sum_{k=j+1..i} log sigmoid(w_h . x_k + beta_h)",
               "Lin et al., ICLR 2025 (Forgetting Transformer, FoX)", context_dependent=True,
               default_options={"gate": "full", "decay_time_min": None, "decay_time_max": None}),
    SchemeInfo("rope", "rope", "RoPE", "none: q, k rotated by i * theta_f, theta_f = base^(-2f / d_rot)",
               "Su et al., 2021 (RoFormer, RoPE)", adds_bias=False, rotary=True,
               default_options={"base": 10000.0, "fraction": 1.0}),
    SchemeInfo("learned", "absolute", "Learned", "none (learned absolute position embeddings)",
               "Radford et al., 2019 (GPT-2)", adds_bias=False, absolute_positions=True),
    SchemeInfo("nope", "absolute", "NoPE", "none (no position information)",
               "Kazemnejad et al., NeurIPS 2023 (NoPE)", adds_bias=False),
)  # fmt: skip

_BY_NAME = {s.name: s for s in TABLE}
_ALIASES = {a: s.name for s in TABLE for a in s.aliases}


def names() -> list[str]:
    """The schemes' own names, in listing order."""
    return [s.name for s in TABLE]


def all_names() -> list[str]:
    """Every accepted spelling: scheme names followed by aliases."""
    return [*names(), *_ALIASES]


def canonical_name(name: str) -> str:
    """Resolve an alias (``kerple``, ``t5-bias``) to the scheme's own name; error if unknown.

    >>> canonical_name("T5-Bias")
    't5'
    """
    key = name.strip().lower()
    if key in _BY_NAME:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    raise BiasvizError(f"unknown scheme '{name}'; valid schemes: {', '.join(sorted(all_names()))}")


def info(name: str) -> SchemeInfo:
    """The table entry of ``name`` or one of its aliases."""
    return _BY_NAME[canonical_name(name)]


def scheme_class(name: str) -> type:
    """The class implementing ``name`` (imports its module, and torch with it)."""
    entry = info(name)
    module = importlib.import_module(f"biasviz.schemes.{entry.module}")
    return getattr(module, entry.cls)
