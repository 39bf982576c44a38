"""`biasviz plot` and `biasviz diagnose` end to end on small synthetic format-1 files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from biasviz.cli import cli
from biasviz.store import BiasFileWriter

T, H, LAYER = 64, 12, 3
ATTRS = {"source_model": "synthetic", "model_sha256": "0" * 64, "architecture": "gpt2", "n_layers": 4, "seed": 0,
         "text_source": "synthetic", "device": "cpu", "biasviz_version": "0.1.0", "torch_version": "none"}  # fmt: skip


def _dist(t: int) -> np.ndarray:
    pos = np.arange(t)
    return pos[:, None] - pos[None, :]


def _alibi(n: int, t: int = T, heads: int = H) -> np.ndarray:
    slopes = 2.0 ** (-8 * np.arange(1, heads + 1) / heads)
    b = -slopes[:, None, None] * np.maximum(_dist(t), 0)
    return np.repeat(b[None], n, axis=0).astype(np.float32)


def _cable(n: int, t: int = T) -> np.ndarray:
    rng = np.random.default_rng(0)
    s = -np.cumsum(np.log1p(np.exp(rng.normal(size=(n, H, t)))), axis=-1)
    return (s[..., :, None] - s[..., None, :]).astype(np.float32)


def _weights(bias: np.ndarray) -> np.ndarray:
    z = np.where(_dist(bias.shape[-1]) >= 0, bias, -np.inf)
    e = np.exp(z - z.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def write_file(path: Path, scheme: str, bias: np.ndarray | None, n: int = 2, t: int = T) -> Path:
    has_bias = bias is not None
    heads = bias.shape[1] if has_bias else H
    w = _weights(bias) if has_bias else _weights(np.zeros((n, heads, t, t), np.float32))
    attrs = {**ATTRS, "scheme": scheme, "context_dependent": scheme == "cable"}
    with BiasFileWriter(path, attrs=attrs, n_samples=n, n_heads=heads, seq_len=t, layers=[LAYER], has_bias=has_bias,
                        force=True) as writer:  # fmt: skip
        writer.write_batch(np.zeros((n, t), np.int32), weights={LAYER: w},
                           bias={LAYER: bias} if has_bias else None)  # fmt: skip
    return path


def run(*args: str) -> object:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("data")
    # alibi-4: four heads, for the tests of which files a plot writes or keeps (a third of the panels to draw)
    return {"alibi": write_file(d / "alibi.h5", "alibi", _alibi(2)),
            "alibi-4": write_file(d / "alibi-4.h5", "alibi", _alibi(2, heads=4)),
            "cable": write_file(d / "cable.h5", "cable", _cable(3), n=3),
            "nope": write_file(d / "nope.h5", "nope", None)}  # fmt: skip


def test_plot_writes_pdf_and_png_with_provenance(files: dict[str, Path], tmp_path: Path) -> None:
    res = run("plot", "--scheme", "alibi", "--input", str(files["alibi"]), "--out-dir", str(tmp_path / "figs"))
    assert res.exit_code == 0, res.output
    pdf, png = tmp_path / "figs" / "alibi_bias.pdf", tmp_path / "figs" / "alibi_bias.png"
    assert pdf.exists() and png.exists()
    assert b"/Subtype /Image" in pdf.read_bytes() or b"/Subtype/Image" in pdf.read_bytes()
    meta = pdf.read_bytes()
    assert b"layer=3" in meta and b"reduction=none" in meta and str(files["alibi"]).encode() in meta
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["alibi_bias.pdf", "alibi_bias.png"]


def test_plot_kind_all_mean_svg_and_alias(files: dict[str, Path], tmp_path: Path) -> None:
    res = run("plot", "--scheme", "CABLE", "--input", str(files["cable"]), "--kind", "all", "--sample", "mean",
              "--log", "--format", "svg", "--out-dir", str(tmp_path))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert {p.name for p in tmp_path.iterdir()} == {"cable_bias.svg", "cable_weights.svg"}
    assert b"sample=mean" in (tmp_path / "cable_bias.svg").read_bytes()


def test_plot_default_input_and_normalize(files: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    os.symlink(files["alibi-4"], tmp_path / "data" / "alibi.h5")
    res = run("plot", "--scheme", "alibi", "--normalize", "diagonal", "--format", "png", "--style", "acl-column")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "figures" / "alibi_bias.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scheme", "alibi", "--input", "{cable}"], "holds scheme 'cable', not 'alibi'"),
        (["--scheme", "nope", "--input", "{nope}"], "--kind weights"),
        (["--scheme", "alibi", "--input", "{alibi}", "--sample", "7"], "sample 7 out of range"),
        (["--scheme", "alibi", "--input", "{alibi}", "--sample", "first"], "--sample must be"),
        (["--scheme", "alibi", "--input", "{alibi}", "--format", "jpg"], "unknown figure format"),
        (["--scheme", "alibi", "--input", "{alibi}", "--cmap", "nosuchmap"], "unknown colormap"),
        (["--scheme", "alibi", "--input", "{alibi}", "--layer", "0"], "layer 0 is not in"),
        (["--scheme", "nosuch"], "unknown scheme"),
        (["--scheme", "alibi", "--input", "{alibi}", "--log"], "--log applies to attention weights"),
    ],
)
def test_plot_errors_are_one_line(files: dict[str, Path], tmp_path: Path, capsys, args: list[str],
                                  message: str) -> None:  # fmt: skip
    from biasviz.cli import main

    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    with pytest.raises(SystemExit) as exc:
        main(["plot", *args, "--out-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert exc.value.code in (1, 2)
    assert err.startswith("Error:") and message in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_plot_failure_keeps_previous_figures(files: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    run("plot", "--scheme", "alibi", "--input", str(files["alibi-4"]), "--format", "png", "--out-dir", str(tmp_path))
    before = (tmp_path / "alibi_bias.png").read_bytes()
    from matplotlib.figure import Figure

    def broken(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", broken)
    # --force: without it the run would stop at the figure already there, before any write could fail
    res = CliRunner().invoke(cli, ["plot", "--scheme", "alibi", "--input", str(files["alibi-4"]), "--format", "png",
                                   "--out-dir", str(tmp_path), "--force"])  # fmt: skip
    assert res.exit_code != 0 and "no space left" in str(res.exception), res.exception
    assert (tmp_path / "alibi_bias.png").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["alibi_bias.png"]


def test_nope_kind_all_draws_weights_only(files: dict[str, Path], tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["plot", "--scheme", "nope", "--input", str(files["nope"]), "--kind", "all",
                                   "--format", "png", "--out-dir", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 0
    assert [p.name for p in tmp_path.iterdir()] == ["nope_weights.png"]


def test_diagnose_json_and_figures(files: dict[str, Path], tmp_path: Path) -> None:
    res = run("diagnose", str(files["alibi"]), str(files["cable"]), str(files["nope"]), "--out-dir", str(tmp_path),
              "--format", "png")  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "diagnostics.json").read_text())
    assert list(doc["schemes"]) == ["alibi", "cable"]
    alibi = doc["schemes"]["alibi"]["heads"]
    assert [h["head"] for h in alibi] == list(range(1, 13))
    assert all(h["context_dependence"] == 0.0 and h["toeplitz_residual"] == 0.0 for h in alibi)
    cable = doc["schemes"]["cable"]
    assert all(h["context_dependence"] > 0.01 and h["toeplitz_residual"] > 0.01 for h in cable["heads"])
    assert cable["samples"] == 3 and cable["layer"] == LAYER
    names = {p.name for p in tmp_path.iterdir()}
    assert {"diagnostics.png", "alibi_bias_profile.png", "cable_bias_profile.png"} <= names


def test_diagnose_one_sample_gives_null_with_a_note(tmp_path: Path) -> None:
    one = write_file(tmp_path / "one.h5", "alibi", _alibi(1), n=1)
    res = CliRunner().invoke(cli, ["diagnose", str(one), "--json", str(tmp_path / "d.json"), "--no-figures"])
    assert res.exit_code == 0
    assert "at least 2 samples" in res.output  # the note (stderr is mixed into output)
    heads = json.loads((tmp_path / "d.json").read_text())["schemes"]["alibi"]["heads"]
    assert all(h["context_dependence"] is None and h["toeplitz_residual"] == 0.0 for h in heads)


def test_long_file_is_reduced(tmp_path: Path) -> None:
    t = 700  # above --max-cells 600: drawn as 2x2 block means
    path = write_file(tmp_path / "alibi.h5", "alibi", _alibi(1, t)[:, :, :, :], n=1, t=t)
    res = run("plot", "--scheme", "alibi", "--input", str(path), "--format", "pdf", "--out-dir", str(tmp_path),
              "--max-cells", "600")  # fmt: skip
    assert res.exit_code == 0, res.output
    meta = (tmp_path / "alibi_bias.pdf").read_bytes()
    assert b"block mean 2x2" in meta and b"700 -> 350 cells per axis" in meta
    # by default a panel gets at most one cell a pixel: NeurIPS' 5.5 in over 3 panels, 56 % of each the image,
    # at 200 dpi is 205 pixels, so 700 positions are drawn as 4 x 4 block means (175 cells)
    res = run("plot", "--scheme", "alibi", "--input", str(path), "--format", "pdf", "--out-dir", str(tmp_path),
              "--force")  # fmt: skip
    assert res.exit_code == 0, res.output
    meta = (tmp_path / "alibi_bias.pdf").read_bytes()
    assert b"block mean 4x4" in meta and b"700 -> 175 cells per axis" in meta


def test_bidirectional_weights_keep_their_upper_triangle(tmp_path, monkeypatch) -> None:
    """A T5-encoder file attends both ways: nothing above the diagonal may be blanked."""
    from biasviz.plotting.load import load_heads
    from biasviz.store import open_bias_file

    t = 16
    rng = np.random.default_rng(0)
    weights = rng.random((1, H, t, t)).astype(np.float32)
    weights /= weights.sum(-1, keepdims=True)  # full rows: attention in both directions
    attrs = {"scheme": "t5", "context_dependent": False, "source_model": "synthetic", "model_sha256": "",
             "architecture": "t5-encoder", "n_layers": 1, "seed": 0, "text_source": "none", "device": "cpu",
             "biasviz_version": "0", "torch_version": "0"}  # fmt: skip
    path = tmp_path / "enc.h5"
    with BiasFileWriter(path, attrs=attrs, n_samples=1, n_heads=H, seq_len=t, layers=[0], has_bias=False,
                        causal=False) as w:  # fmt: skip
        w.write_batch(np.zeros((1, t), dtype=np.int32), {0: weights})
    with open_bias_file(path) as bf:
        drawn = load_heads(bf, "weights", layer=0, sample=0).data
    np.testing.assert_allclose(drawn, weights[0], rtol=1e-6)
    import biasviz.plotting.save as save
    from biasviz.cli import main

    drawn_figs = []
    real_save = save.save_figure
    monkeypatch.setattr(save, "save_figure", lambda fig, *a, **k: drawn_figs.append(fig) or real_save(fig, *a, **k))
    main(["plot", "--scheme", "t5", "--input", str(path), "--kind", "weights", "--layer", "0", "--format", "png",
          "--out-dir", str(tmp_path / "figs")])  # fmt: skip
    (fig,) = drawn_figs
    image = next(ax for ax in fig.axes if ax.get_images()).get_images()[0].get_array()
    assert not np.ma.getmaskarray(image).any() and np.isfinite(np.ma.getdata(image)).all()  # no blanked triangle


def test_plot_never_overwrites_a_figure_without_force(files: dict[str, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """A figure of the same name (the user's, or an earlier plot's) is kept, and the error says how to replace it.
    PNG only: the set is then two files, the bias figure drawn before the weights' whose name is taken, so that a
    set written up to the clash would leave alibi_bias.png (the formats a set is written in: the tests above)."""
    from tests.conftest import run_cli

    out = tmp_path / "figs"
    out.mkdir()
    (out / "alibi_weights.png").write_bytes(b"my own figure")
    args = ["plot", "--scheme", "alibi", "--input", str(files["alibi-4"]), "--kind", "all", "--format", "png",
            "--out-dir", str(out)]  # fmt: skip
    code, stdout, err = run_cli(args, capsys)
    assert code == 1 and stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), err
    assert str(out / "alibi_weights.png") in lines[0] and "--force" in lines[0]
    assert sorted(p.name for p in out.iterdir()) == ["alibi_weights.png"]  # nothing of the set was written
    assert (out / "alibi_weights.png").read_bytes() == b"my own figure"
    code, _, err = run_cli([*args, "--force"], capsys)
    assert code == 0, err
    assert (out / "alibi_weights.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {p.name for p in out.iterdir()} == {"alibi_bias.png", "alibi_weights.png"}
