"""`plot --caption`: a LaTeX caption beside each figure, from the file, with every value read from it escaped."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from biasviz.cli import cli
from biasviz.plotting.caption import latex_escape
from tests.cli.test_plot_cmd import _alibi, write_file

HOSTILE = r"\input{/etc/passwd}} $x$ & #1 ^ _ % ~ \end{document}"
HOSTILE_MODEL = r"\input{passwd}} $x$ & #1 ^ _ % ~ \end{document}"  # a caption names a model by its last part
SPECIALS = set("\\{}$&#^_%~")

# what each escape prints, written out here (not read from the code): the inverse a LaTeX run would apply
PRINTS = {r"\textbackslash{}": "\\", r"\textasciicircum{}": "^", r"\textasciitilde{}": "~", r"\textless{}": "<",
          r"\textgreater{}": ">", r"\textbar{}": "|", r"\{": "{", r"\}": "}", r"\$": "$", r"\&": "&", r"\#": "#",
          r"\_": "_", r"\%": "%"}  # fmt: skip
_ESCAPE = re.compile("|".join(re.escape(k) for k in sorted(PRINTS, key=len, reverse=True)))


def printed(latex: str) -> str:
    """What LaTeX prints for ``latex`` made of plain characters and the escapes of ``PRINTS`` alone; a special
    character left unescaped is an error (it would run as LaTeX)."""
    plain = _ESCAPE.sub("\0", latex)
    stray = SPECIALS & set(plain)
    assert not stray, f"unescaped {stray} in {latex!r}"
    return _ESCAPE.sub(lambda m: PRINTS[m.group()], latex)


@pytest.mark.parametrize("text", [HOSTILE, "plain words", "tab\tand\nnewline", "~^_%#&$}{\\", "<a|b>"])
def test_escaped_text_prints_the_characters_it_was_given(text: str) -> None:
    # a line break or tab would end the caption's paragraph or vanish: each prints as one space
    assert printed(latex_escape(text)) == re.sub(r"\s", " ", text)


def caption_body(tex: str) -> str:
    """The argument of the file's one ``\\caption{...}``, checked to close at the file's end: braces balance once
    escaped ones are left out, and no unescaped % comments the closing brace away."""
    lines = [line for line in tex.splitlines() if not line.startswith("% ")]
    text = "\n".join(lines).strip()
    assert text.startswith("\\caption{") and text.endswith("}"), text
    body = text[len("\\caption{") : -1]
    depth = 0
    for token in re.findall(r"\\[{}%$&#_]|[{}]|%", body):
        assert token != "%", f"an unescaped % in {body!r}"
        if token in "{}":
            depth += 1 if token == "{" else -1
            assert depth >= 0, f"the caption closes early: {body!r}"
    assert depth == 0, body
    return body


@pytest.fixture(scope="module")
def hostile_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_file(tmp_path_factory.mktemp("cap") / "alibi.h5", "alibi", _alibi(2))
    with h5py.File(path, "r+") as f:
        f.attrs["source_model"] = HOSTILE_MODEL
        f.attrs["text_source"] = "corpus_%1 & notes~"
        f.attrs["training"] = '{"preset": "t}\\\\input{/etc/passwd}", "steps": 300, "seq_len": 64}'
    return path


def test_plot_caption_says_what_the_figure_shows_and_escapes_the_file(hostile_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "figs"
    result = CliRunner().invoke(cli, ["plot", "--scheme", "alibi", "--input", str(hostile_file), "--caption",
                                      "--out-dir", str(out), "--format", "png"])  # fmt: skip
    assert result.exit_code == 0, result.output
    tex = (out / "alibi_bias.tex").read_text("utf-8")
    assert f"wrote {out / 'alibi_bias.tex'}" in result.output
    body = caption_body(tex)
    assert "\\input{" not in body and "\\end{" not in body
    words = printed(re.sub(r"\$[^$]*\$|\\texttt\{([^}]*)\}", r"\1", body.replace(r"\$", "\0")).replace("\0", r"\$"))
    assert HOSTILE_MODEL in words  # the source model, character for character
    assert "corpus_%1 & notes~" in words
    assert "t}\\input{/etc/passwd} model, 300 training steps on 64-token windows" in words
    assert "Final layer, 4 of 4" in words and "$T = 64$" in body and "12 heads" in words
    assert "mean of 2 samples" in words or "sample" in words
    # ALiBi's bias is <= 0 everywhere: sequential on every head, none diverging
    assert "sequential" in words and "diverging" not in words


def test_caption_names_the_heads_whose_values_change_sign(tmp_path: Path) -> None:
    bias = _alibi(2)
    bias[:, [1, 6]] += 0.5  # heads 2 and 7 (from 1): above 0 near the diagonal, below it far away
    path = write_file(tmp_path / "alibi.h5", "alibi", bias)
    result = CliRunner().invoke(cli, ["plot", "--scheme", "alibi", "--input", str(path), "--caption", "--out-dir",
                                      str(tmp_path), "--format", "png"])  # fmt: skip
    assert result.exit_code == 0, result.output
    body = " ".join(caption_body((tmp_path / "alibi_bias.tex").read_text("utf-8")).split())
    # each head's sides over the cells a query sees: both at least a twentieth of the range -> its own extremes;
    # a smaller side under it -> symmetric; one sign -> symmetric on the figure's one diverging map
    seen = np.tril(np.ones((bias.shape[-1],) * 2, dtype=bool))
    lows, highs = (f(bias[0][:, seen], axis=-1) for f in (np.min, np.max))
    both = [(h + 1, min(-lo, hi) >= (hi - lo) / 20) for h, (lo, hi) in enumerate(zip(lows, highs, strict=True))
            if lo < 0 < hi]  # fmt: skip
    own, noise = [h for h, big in both if big], [h for h, big in both if not big]
    assert own == [7] and noise == [2]  # head 7's +0.5 is a fifth of its range; head 2's, a fiftieth
    one_sign = ", ".join(str(h) for h in range(1, 13) if h not in own + noise)
    assert ("One diverging colour scale per head, white at 0: each side to its own extreme for head 7, whose values "
            "change sign; symmetric about 0, to the largest magnitude, for head 2, whose smaller side is under a "
            f"twentieth of the range, and for heads {one_sign}, whose values have one sign.") in body


def test_no_caption_unless_asked_and_the_api_carries_it(hostile_file: Path, tmp_path: Path) -> None:
    import biasviz

    result = CliRunner().invoke(cli, ["plot", "--scheme", "alibi", "--input", str(hostile_file), "--out-dir",
                                      str(tmp_path), "--format", "png"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alibi_bias.png"]
    fig = biasviz.plot(hostile_file, kind="bias")
    assert "Final layer, 4 of 4" in caption_body(fig.biasviz_caption)


def test_diagnose_caption_beside_each_figure_escapes_every_file(hostile_file: Path, tmp_path: Path) -> None:
    """``diagnose --caption``: diagnostics.tex for the figure of every file and <name>_bias_profile.tex beside each
    file's own; the file's values printed as their characters, never run; none without --figures."""
    out = tmp_path / "figs"
    result = CliRunner().invoke(cli, ["diagnose", str(hostile_file), "--caption", "--out-dir", str(out),
                                      "--format", "png"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir() if p.suffix == ".tex"} == {"diagnostics.tex", "alibi_bias_profile.tex"}
    for name in ("diagnostics", "alibi_bias_profile"):
        assert f"wrote {out / f'{name}.tex'}" in result.output
        body = caption_body((out / f"{name}.tex").read_text("utf-8"))
        assert "\\input{" not in body and "\\end{" not in body
        words = printed(re.sub(r"\$[^$]*\$|\\texttt\{([^}]*)\}", r"\1", body.replace(r"\$", "\0")).replace("\0", r"\$"))
        assert HOSTILE_MODEL in words and "300 training steps on 64-token windows" in words
        assert "Final layer, 4 of 4" in words
    diagnostics = caption_body((out / "diagnostics.tex").read_text("utf-8"))
    assert "context dependence" in diagnostics and "separability residual" in diagnostics and "N = 2" in diagnostics
    assert "distance" in caption_body((out / "alibi_bias_profile.tex").read_text("utf-8"))
    refused = CliRunner().invoke(cli, ["diagnose", str(hostile_file), "--caption", "--no-figures", "--json",
                                       str(tmp_path / "d.json")])  # fmt: skip
    assert refused.exit_code != 0 and "--caption" in str(refused.exception) and not (tmp_path / "d.json").exists()


def test_a_caption_names_the_model_without_the_folders_above_it(tmp_path: Path, make_bias_file: object) -> None:
    """A double-blind paper's caption must not carry the author's home folder or lab: the model's own name only."""
    import biasviz

    src = make_bias_file(tmp_path / "alibi.h5", "alibi", heads=3, t=16,
                         attrs={"source_model": "/home/jane-doe/acme-lab/runs/alibi-tiny/"})  # fmt: skip
    fig = biasviz.plot(src, kind="bias")
    body = caption_body(fig.biasviz_caption)
    assert "; model alibi-tiny;" in body, body
    assert "jane-doe" not in body and "acme-lab" not in body and "/home" not in body
