"""``biasviz extract`` and ``biasviz.extract`` check one request: ``--compression`` from the command line, and the
same mistakes refused with the same message by both."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

import biasviz
from biasviz.common.errors import BiasvizError
from biasviz.data import build_tokenizer, save_tokenizer
from tests.conftest import run_cli, small_model

TEXT = "\n".join(f"def g{i}(y):\n    return y - {i} * {i + 3}  # row {i}" for i in range(300))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ALiBi checkpoint (it adds a bias) with its tokenizer, and a text file."""
    root = tmp_path_factory.mktemp("req")
    small_model("alibi", vocab_size=300).save_pretrained(root / "alibi")
    save_tokenizer(build_tokenizer([TEXT], 300), root / "alibi")
    (root / "text.txt").write_text(TEXT)
    return root


def _args(ckpt: Path, out: Path, *extra: str) -> list[str]:
    return ["extract", "--model", str(ckpt / "alibi"), "--text", str(ckpt / "text.txt"), "--seq-len", "20",
            "--samples", "2", "--device", "cpu", "--quiet", "--out", str(out), *extra]  # fmt: skip


def test_each_compression_holds_what_gzip_holds_and_info_names_it(ckpt: Path, tmp_path: Path, capsys) -> None:
    shown = {"gzip": "gzip level 1 + shuffle", "gzip:6": "gzip level 6 + shuffle", "lzf": "lzf + shuffle",
             "none": "uncompressed"}  # fmt: skip
    values = {}
    for choice, filters in shown.items():
        out = tmp_path / f"{choice.replace(':', '_')}.h5"
        code, _, err = run_cli(_args(ckpt, out, "--compression", choice), capsys)
        assert code == 0, err
        with h5py.File(out, "r") as f:
            values[choice] = {k: f[f"layer_1/{k}"][()] for k in ("bias", "weights")}
            names = (f["layer_1/weights"].compression, f["layer_1/bias"].compression)
        assert names == ((None, None) if choice == "none" else (choice.split(":")[0],) * 2)
        code, info, err = run_cli(["info", str(out)], capsys)
        assert code == 0 and filters in info, info
    for choice, got in values.items():
        for kind in ("bias", "weights"):
            np.testing.assert_array_equal(got[kind], values["gzip"][kind], err_msg=f"{choice} {kind}")
    w = values["gzip"]["weights"]
    assert np.allclose(w.sum(axis=-1), 1.0, atol=1e-5) and not np.triu(w[0, 0], 1).any()  # rows of a causal softmax


# (id, the command's options, biasviz.extract's keywords): each refused alike
BAD = [
    ("resolution-without-summary", ["--resolution", "8"], {"resolution": 8}),
    ("bad-compression", ["--compression", "zstd"], {"compression": "zstd"}),
    ("gzip-level-12", ["--compression", "gzip:12"], {"compression": "gzip:12"}),
    ("compression-with-summary", ["--summary", "--compression", "lzf"], {"summary": True, "compression": "lzf"}),
    ("capture-with-summary", ["--summary", "--capture", "bias,weights,scores"],
     {"summary": True, "capture": "bias,weights,scores"}),
    ("device-with-map", ["--device-map", "auto"], {"device_map": "auto", "device": "cpu"}),
    ("map-with-own-code", ["--device-map", "auto", "--device", "auto", "--model", "mine.py:build"],
     {"device_map": "auto", "device": "auto", "model": "module"}),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "kwargs"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_the_command_and_the_api_refuse_alike(ckpt: Path, tmp_path: Path, capsys, argv: list[str],
                                              kwargs: dict) -> None:  # fmt: skip
    out = tmp_path / "cli.h5"
    code, stdout, err = run_cli(_args(ckpt, out, *argv), capsys)
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and lines[0].startswith("Error: "), err
    assert not stdout and not list(tmp_path.iterdir())
    kwargs = dict(kwargs)
    model = small_model("alibi", vocab_size=300) if kwargs.pop("model", None) else str(ckpt / "alibi")
    with pytest.raises(BiasvizError) as caught:
        biasviz.extract(model, np.zeros((2, 20), dtype=np.int64), tmp_path / "api.h5", progress=False,
                        **{"device": "cpu", **kwargs})  # fmt: skip
    assert lines[0] == f"Error: {caught.value}"
    assert not list(tmp_path.iterdir())
