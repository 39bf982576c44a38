"""The model's capture points (:mod:`biasviz.model.hooks`): their pinned names, and hooks that never outlive their
``with`` block."""

from __future__ import annotations

import pytest

from biasviz.model import capture, hook_name, hook_points
from tests.conftest import small_model


def test_hook_names_are_pinned() -> None:
    names = sorted(hook_points(small_model("alibi")))
    assert names == [
        "blocks.0.attn.hook_bias", "blocks.0.attn.hook_k", "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_q",
        "blocks.0.attn.hook_scores",
        "blocks.1.attn.hook_bias", "blocks.1.attn.hook_k", "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_q",
        "blocks.1.attn.hook_scores",
    ]  # fmt: skip
    assert hook_name(1, "hook_pattern") == "blocks.1.attn.hook_pattern"


def test_hooks_are_removed_after_the_block_even_on_error() -> None:
    model = small_model("alibi")
    with pytest.raises(RuntimeError), capture(model, "blocks.1.attn.*", lambda t, n, r0: None):
        assert all(p.active for n, p in hook_points(model).items() if n.startswith("blocks.1"))
        raise RuntimeError
    assert not any(p.active for p in hook_points(model).values())
