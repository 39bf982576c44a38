"""Training: offline, reproducible, and a checkpoint that from_pretrained loads."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from biasviz.common.errors import BiasvizError
from biasviz.data import load_tokenizer
from biasviz.training.loop import TrainSettings, train


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("corpus")
    text = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400))
    (d / "a.py").write_text(text)
    (d / "b.txt").write_text("the cat sat on the mat. " * 300)
    return d


def settings(scheme: str, corpus, **kw) -> TrainSettings:
    base = dict(scheme=scheme, steps=12, seq_len=32, batch_size=4, corpus=str(corpus), device="cpu", warmup=2)
    return TrainSettings(**{**base, **kw})


def test_training_writes_a_loadable_checkpoint_and_learns(corpus, tmp_path) -> None:
    out = tmp_path / "ckpt"
    result = train(settings("alibi", corpus, steps=40), out, progress=False)
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json", "training.json"}
    assert sum(result.losses[-5:]) / 5 < result.losses[0] - 1.0
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = load_tokenizer(out)
    assert model.config.vocab_size == tok.get_vocab_size() <= 2048
    with torch.no_grad():  # trained at T = 32, runs far beyond it
        long = model(torch.randint(0, model.config.vocab_size, (1, 512))).logits
    assert torch.isfinite(long).all()
    record = json.loads((out / "training.json").read_text())
    assert record["settings"]["scheme"] == "alibi" and record["corpus_source"] == str(corpus.resolve())
    # the route every step's attention took, counted: on a CPU, attention this small (one block of the recomputation)
    # is kept whole (tests/model/test_routes_training.py)
    assert record["attention_routes"] == {"dense": 40 * model.config.n_layer}


def test_same_seed_same_weights(corpus, tmp_path) -> None:
    a = train(settings("kerple", corpus), tmp_path / "a", progress=False)
    b = train(settings("kerple", corpus), tmp_path / "b", progress=False)
    c = train(settings("kerple", corpus, seed=1), tmp_path / "c", progress=False)
    assert a.losses == b.losses and a.losses != c.losses
    wa = AutoModelForCausalLM.from_pretrained(tmp_path / "a").state_dict()
    wb = AutoModelForCausalLM.from_pretrained(tmp_path / "b").state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_constraints_hold_after_training(corpus, tmp_path) -> None:
    train(settings("kerple-power", corpus, lr=0.5), tmp_path / "k", progress=False)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "k")
    for scheme in model.schemes():
        assert (scheme.r1 >= 0.01).all() and (scheme.r2 >= 0.01).all() and (scheme.r2 <= 2).all()


def test_corpus_too_short_is_a_clear_error(tmp_path) -> None:
    (tmp_path / "tiny.txt").write_text("hi")
    with pytest.raises(BiasvizError, match="corpus has only"):
        train(settings("alibi", tmp_path / "tiny.txt", seq_len=64), tmp_path / "o", progress=False)


@pytest.mark.parametrize(
    "device, precision, autocast",
    [("cpu", "auto", "none"), ("cpu", "bfloat16", "bfloat16"),
     pytest.param("cuda", "auto", "bfloat16", marks=pytest.mark.cuda),
     pytest.param("cuda", "float32", "none", marks=pytest.mark.cuda)],
)  # fmt: skip
def test_mixed_precision_trains_and_saves_float32(corpus, tmp_path, device, precision, autocast) -> None:
    out = tmp_path / "ckpt"
    result = train(settings("kerple-log", corpus, steps=30, device=device, precision=precision), out, progress=False)
    record = json.loads((out / "training.json").read_text())
    assert record["autocast"] == autocast
    assert sum(result.losses[-5:]) / 5 < result.losses[0] - 0.5
    assert len(result.step_seconds) == 30 and result.steady_tokens_per_s > 0
    model = AutoModelForCausalLM.from_pretrained(out)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_unknown_precision_is_refused(corpus, tmp_path) -> None:
    with pytest.raises(BiasvizError, match="unknown precision 'fp8'"):
        train(settings("alibi", corpus, precision="fp8"), tmp_path / "c", progress=False)


@pytest.mark.cuda
def test_compiled_training_matches_eager_losses(corpus, tmp_path) -> None:
    base = settings("alibi", corpus, steps=8, device="cuda", precision="float32")
    eager = train(base, tmp_path / "e", progress=False)
    compiled = train(TrainSettings(**{**base.__dict__, "compile": True}), tmp_path / "c", progress=False)
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-3, abs=1e-3)


def test_train_writes_heartbeat_lines_when_stderr_is_not_a_terminal(corpus, tmp_path, capsys) -> None:
    """In a log (CI, Slurm, a redirected stderr) the run says how far it got, as extract does: one plain line at
    each tenth of the steps (here one per step), with the step count, and no bar's carriage returns."""
    train(settings("alibi", corpus, steps=3), tmp_path / "o", progress=True)
    err = capsys.readouterr().err  # pytest's capture: not a terminal
    lines = [line for line in err.splitlines() if line.startswith("train alibi")]
    assert [line.split(": ", 1)[1].split()[:2] for line in lines] == [["33%", "1/3"], ["67%", "2/3"], ["100%", "3/3"]]
    assert "loss" in lines[-1] and ("step/s" in lines[-1] or "s/step" in lines[-1]) and "\r" not in err, err
    capsys.readouterr()
    train(settings("alibi", corpus, steps=3), tmp_path / "q", progress=False)  # --quiet: nothing at all
    assert "train alibi" not in capsys.readouterr().err
