"""``biasviz extract`` and ``biasviz info`` end to end: defaults, --force, interruption, errors."""

from __future__ import annotations

import os
import signal

import h5py
import numpy as np
import pytest
import torch

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.cli import main
from biasviz.data import build_tokenizer, save_tokenizer
from biasviz.store import open_bias_file
from tests.conftest import run_cli, small_model

TEXT = "\n".join(f"def f{i}(x):\n    return x * {i} + {i * i}  # line {i}" for i in range(400))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):  # noqa: ANN201
    """A tiny biasviz checkpoint (CABLE, vocabulary 300) with its tokenizer, and a text file."""
    root = tmp_path_factory.mktemp("ck")
    small_model("cable", vocab_size=300).save_pretrained(root / "cable")
    save_tokenizer(build_tokenizer([TEXT], 300), root / "cable")
    (root / "text.txt").write_text(TEXT)
    return root


def run(args: list[str], capsys) -> tuple[int, str, str]:  # noqa: ANN001
    return run_cli(args, capsys)


def extract_args(ckpt, *extra: str) -> list[str]:  # noqa: ANN001
    return ["extract", "--model", str(ckpt / "cable"), "--text", str(ckpt / "text.txt"), "--seq-len", "24",
            "--samples", "3", *extra]  # fmt: skip


def test_extract_defaults_and_info(ckpt, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(extract_args(ckpt, "--batch-size", "2"), capsys)
    assert code == 0, err
    target = tmp_path / "data" / "cable.h5"  # --out default: data/<scheme>.h5
    assert "wrote data/cable.h5" in out and "3 samples x 12 heads x 24 x 24" in out
    with open_bias_file(target) as f:
        assert f.layers == [1] and f.has_bias() and f.context_dependent  # --layer -1: the final layer
        assert f.attrs["seed"] == 0 and f.attrs["text_source"] == str((ckpt / "text.txt").resolve())
        assert "checkpoint's own" in f.attrs["tokenizer"]
        first_ids = f.input_ids()
    code, out, err = run(["info", str(target)], capsys)
    assert code == 0, err
    for expected in ("biasviz format 1", "cable (context-dependent", "3 samples x 12 heads x 24 queries x 24 keys",
                     "layer_1/bias", "float32, gzip", "seed 0", "biasviz-gpt2, 2 layers, 12 heads"):  # fmt: skip
        assert expected in out, expected
    code, out, _ = run(["info", "--json", str(target)], capsys)
    assert code == 0 and '"scheme": "cable"' in out and '"n_head": 12' in out
    # the same seed gives the same windows; another seed other ones
    run(extract_args(ckpt, "--out", "same.h5"), capsys)
    run(extract_args(ckpt, "--out", "other.h5", "--seed", "1"), capsys)
    with open_bias_file("same.h5") as a, open_bias_file("other.h5") as b:
        np.testing.assert_array_equal(a.input_ids(), first_ids)
        assert not np.array_equal(b.input_ids(), first_ids)


def test_all_layers_float16(ckpt, tmp_path, capsys):
    out_file = tmp_path / "all.h5"
    code, _, err = run(extract_args(ckpt, "--layer", "all", "--dtype", "float16", "--out", str(out_file)), capsys)
    assert code == 0, err
    with open_bias_file(out_file) as f:
        assert f.layers == [0, 1] and f.dataset("weights", 0).dtype == np.float16
        np.testing.assert_allclose(f.read("weights", 0).sum(-1), 1.0, atol=1e-2)


def test_existing_output_kept_unless_force(ckpt, tmp_path, capsys):
    target = tmp_path / "x.h5"
    target.write_bytes(b"my earlier results")
    code, _, err = run(extract_args(ckpt, "--out", str(target)), capsys)
    assert code == 1 and err.startswith("Error:") and "--force" in err and "Traceback" not in err
    assert target.read_bytes() == b"my earlier results"
    code, _, err = run(extract_args(ckpt, "--out", str(target), "--force"), capsys)
    assert code == 0, err
    with open_bias_file(target) as f:
        assert f.n_samples == 3


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "crash"])
def test_interrupted_run_leaves_nothing_behind(ckpt, tmp_path, monkeypatch, capsys, how):
    target = tmp_path / "x.h5"
    target.write_bytes(b"old")  # with --force the old file must survive a failed run too
    handler = signal.getsignal(signal.SIGTERM)
    calls = {"n": 0}
    original = BiasGPTAdapter.forward

    def failing_forward(self, input_ids):  # noqa: ANN001, ANN202
        calls["n"] += 1
        if calls["n"] == 2:  # after the first batch was written to the temporary file
            if how == "ctrl-c":
                raise KeyboardInterrupt
            if how == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            raise RuntimeError("simulated crash")
        return original(self, input_ids)

    monkeypatch.setattr(BiasGPTAdapter, "forward", failing_forward)
    args = extract_args(ckpt, "--out", str(target), "--force")
    if how == "crash":
        with pytest.raises(RuntimeError, match="simulated"):
            main(args)
    else:
        code, _, err = run(args, capsys)
        assert code == 130 and "interrupted" in err
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.h5"]  # no temporary file either
    assert signal.getsignal(signal.SIGTERM) is handler  # the command restores the previous handler


def test_malicious_checkpoint_via_cli(tmp_path, capsys):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, (f"touch {marker}",))

    torch.save({"model": Evil()}, tmp_path / "evil.pt")
    code, _, err = run(["extract", "--model", str(tmp_path / "evil.pt"), "--out", str(tmp_path / "e.h5")], capsys)
    assert code == 1 and err.startswith("Error: refusing to load") and "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "e.h5").exists()


def test_state_dict_without_tokenizer_uses_bytes_with_a_warning(ckpt, tmp_path, capsys):
    model = small_model("nope", vocab_size=300)
    state = {k.replace("blocks.", "transformer.h.").replace("embed.", "transformer.wte."): v
             for k, v in model.state_dict().items() if not k.startswith("lm_head")}  # fmt: skip
    state = {k.replace("ln_f.", "transformer.ln_f.") if k.startswith("ln_f.") else k: v for k, v in state.items()}
    torch.save({"model": state, "model_args": {"n_head": 12}}, tmp_path / "m.pt")
    args = ["extract", "--model", str(tmp_path / "m.pt"), "--scheme", "nope", "--text", str(ckpt / "text.txt"),
            "--seq-len", "16", "--samples", "2", "--out", str(tmp_path / "m.h5")]  # fmt: skip
    code, out, err = run(args, capsys)
    assert code == 0, err
    assert "Warning:" in err and "UTF-8 bytes" in err and "weights (scheme 'nope' adds no bias)" in out
    with open_bias_file(tmp_path / "m.h5") as f:
        assert f.input_ids().max() < 256 and f.attrs["architecture"] == "nanogpt"
    code, _, err = run([*args[:-1], str(tmp_path / "m2.h5"), "--tokenizer", str(ckpt / "cable")], capsys)
    assert code == 0 and "Warning" not in err


def test_clear_errors(ckpt, tmp_path, capsys):
    cases = [
        (["info", str(tmp_path / "none.h5")], "does not exist"),
        (extract_args(ckpt, "--layer", "7", "--out", str(tmp_path / "a.h5")), "out of range"),
        (extract_args(ckpt, "--scheme", "alibi", "--out", str(tmp_path / "a.h5")), "trained with scheme 'cable'"),
        (extract_args(ckpt, "--seq-len", "100000", "--out", str(tmp_path / "a.h5")), "fewer than --seq-len"),
    ]
    if not torch.cuda.is_available():
        cases.append((extract_args(ckpt, "--device", "cuda", "--out", str(tmp_path / "a.h5")), "no CUDA"))
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["x"] = 1
    cases.append((["info", str(tmp_path / "plain.h5")], "not a biasviz file"))
    (tmp_path / "notes.h5").write_text("text")
    cases.append((["info", str(tmp_path / "notes.h5")], "not a readable HDF5"))
    for args, message in cases:
        code, _, err = run(args, capsys)
        assert code == 1 and err.startswith("Error:") and message in err, (args, err)
        assert "Traceback" not in err
    code, _, err = run(extract_args(ckpt, "--layer", "last"), capsys)
    assert code == 2 and "--layer" in err
    assert not (tmp_path / "a.h5").exists()


def test_help_shows_defaults(capsys):
    code, out, _ = run(["extract", "--help"], capsys)
    assert code == 0
    for text in ("--layer", "default: -1", "--samples", "default: 4", "--seq-len", "default: 512", "--no-scale",
                 "data/<scheme>.h5", "--dtype", "float16"):  # fmt: skip
        assert text in out, text


def test_extract_summary_from_the_cli(ckpt, tmp_path, capsys):
    out = tmp_path / "s.h5"
    code, stdout, err = run(extract_args(ckpt, "--summary", "--resolution", "8", "--out", str(out)), capsys)
    assert code == 0, err
    assert "summary of 3 samples: 12 heads x 8 x 8 blocks of 3 positions" in stdout
    with h5py.File(out, "r") as f:
        assert bool(f.attrs["summary"]) and f.attrs["resolution"] == 8 and f.attrs["samples"] == 3
        assert f["layer_1/weights_mean"].shape == (12, 8, 8) and f["layer_1/bias_profile"].shape == (2, 12, 24)
        assert f["input_ids"].shape == (3, 24)


@pytest.mark.parametrize(("extra", "message"), [
    (["--resolution", "8"], "--resolution applies with --summary"),
    (["--summary", "--resolution", "0"], "--resolution must be"),
])  # fmt: skip
def test_summary_options_that_cannot_apply(ckpt, tmp_path, capsys, extra, message):
    out = tmp_path / "s.h5"
    code, _, err = run(extract_args(ckpt, *extra, "--out", str(out)), capsys)
    assert code in (1, 2) and "Error:" in err and message in err and not out.exists()


def test_a_resolution_above_the_length_gives_the_exact_maps(ckpt, tmp_path, capsys):
    """docs/hdf5.md, 'Summary files': R >= T makes blocks of one position, the same maps as R = T (R stored as
    given)."""
    paths = {r: tmp_path / f"r{r}.h5" for r in (24, 25)}
    for r, out in paths.items():
        code, _, err = run(extract_args(ckpt, "--summary", "--resolution", str(r), "--out", str(out)), capsys)
        assert code == 0, err
    with h5py.File(paths[24]) as exact, h5py.File(paths[25]) as above:
        assert above.attrs["resolution"] == 25 and above.attrs["block"] == exact.attrs["block"] == 1
        np.testing.assert_array_equal(above["layer_1/bias_mean"][()], exact["layer_1/bias_mean"][()])
