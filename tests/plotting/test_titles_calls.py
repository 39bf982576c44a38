"""A traced model's layer is an attention call, not always a layer of the model (DiffLlama's two calls a layer, a
hybrid's attention in some layers only): every figure's title and caption then says "attention call" and names the
module that made it, as the file records it (``call_modules``, data from the file: checked, drawn as text)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

import biasviz

OWNERS = ["model.layers.0.self_attn", "model.layers.0.self_attn", "model.layers.1.self_attn",
          "model.layers.1.$elf_attn"]  # fmt: skip  (a name is data: a "$" is drawn, not math)


@pytest.mark.parametrize(("layer", "said"), [
    (1, "attention call 2 of 4 (model.layers.0.self_attn)"),
    (3, "final attention call, 4 of 4 (model.layers.1.$elf_attn)"),
])  # fmt: skip
def test_a_traced_file_s_figure_names_the_call_and_its_module(tmp_path: Path, make_bias_file: Callable[..., Path],
                                                              layer: int, said: str) -> None:  # fmt: skip
    path = make_bias_file(tmp_path / "traced.h5", "alibi", n=2, heads=12, t=16, layers=(1, 3),
                          attrs={"n_layers": 4, "call_modules": json.dumps(OWNERS)})  # fmt: skip
    fig = biasviz.plot(path, kind="bias", layer=layer)
    title = fig.get_suptitle()
    assert said.replace("$", r"\$") in title, title  # the "$" escaped for matplotlib's text
    fig.canvas.draw()  # the title is drawn as the characters it holds: no math mode to fail
    assert said.capitalize()[:1] + said[1:] in fig.biasviz_caption.replace(r"\$", "$").replace(r"\_", "_")
    plt.close(fig)


@pytest.mark.parametrize("recorded", [json.dumps(OWNERS[:3]), "not json", json.dumps([1, 2, 3, 4])])
def test_a_record_not_of_one_module_a_call_leaves_the_layer(tmp_path: Path, recorded: str,
                                                           make_bias_file: Callable[..., Path]) -> None:
    path = make_bias_file(tmp_path / "odd.h5", "alibi", n=2, heads=12, t=16, layers=(1,),
                          attrs={"n_layers": 4, "call_modules": recorded})  # fmt: skip
    fig = biasviz.plot(path, kind="bias", layer=1)
    assert "layer 2 of 4" in fig.get_suptitle() and "attention call" not in fig.get_suptitle()
    plt.close(fig)


def test_diagnose_names_the_call_and_its_module_in_titles_and_captions(tmp_path: Path,
                                                                       make_bias_file: Callable[..., Path]) -> None:
    """``biasviz diagnose`` of a traced file: the figure of every file, each file's profile and their captions say
    "attention call" and the module, the module's name in its own case (a caption's first letter only raised)."""
    from click.testing import CliRunner

    from biasviz.cli import cli

    owners = ["model.Layers.0.attn", "model.Layers.0.attn", "model.Layers.1.attn", "model.Layers.1.attn"]
    path = make_bias_file(tmp_path / "traced.h5", "alibi", n=2, heads=4, t=16, layers=(2,),
                          attrs={"n_layers": 4, "call_modules": json.dumps(owners)})  # fmt: skip
    seen: list[str] = []
    original = plt.Figure.suptitle

    def suptitle(fig: plt.Figure, text: str, **kwargs: object) -> object:
        seen.append(text)
        return original(fig, text, **kwargs)

    out = tmp_path / "figs"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plt.Figure, "suptitle", suptitle)
        result = CliRunner().invoke(cli, ["diagnose", str(path), "--layer", "2", "--caption", "--out-dir", str(out),
                                          "--format", "png"])  # fmt: skip
    assert result.exit_code == 0, result.output
    said = "attention call 3 of 4 (model.Layers.1.attn)"
    assert len(seen) == 2 and all(said in text for text in seen), seen  # the figure of every file, the profile
    for name in ("diagnostics", "alibi_bias_profile"):
        text = (out / f"{name}.tex").read_text("utf-8").replace(r"\_", "_")
        assert "A" + said[1:] in text, text
