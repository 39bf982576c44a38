"""The examples of README and of the documentation site run as written, in order, right after ``make figures``.

A new user runs ``make figures`` and then copies the examples one after the other: README's, then the site's
pages in the order of its navigation (``tests/docs_pages.py``). Every command that refuses
to replace an output (``train --out``, ``extract --out``, ``explore --out``, ``diagnose --json``) must find its
output free, or say ``--force`` where it replaces what an earlier example wrote; no example may replace what
``make figures`` made. The files ``make figures`` leaves are read off the Makefile's own variables; the rule
that an existing output is refused without ``--force`` is shown on the real commands (train, extract, explore).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.docs_pages import blocks

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()


def make_variable(name: str) -> list[str]:
    """A Makefile variable's words, with ``$(SCHEMES)``-style references expanded."""
    value = re.search(rf"^{name}\s*:?=(.*)$", MAKEFILE, re.M).group(1).split("#")[0]
    return [w for word in value.split() for w in (make_variable(word[2:-1]) if word.startswith("$(") else [word])]


def make_figures_outputs() -> set[str]:
    """What ``make figures`` leaves in runs/, data/ and figures/ (the rules of the Makefile, by their variables)."""
    schemes, positional = make_variable("SCHEMES"), make_variable("POSITIONAL")
    dynamics, long = make_variable("DYNAMICS"), make_variable("LONG")
    out = {f"runs/{s}" for s in {*schemes, *positional}}
    out |= {f"data/{s}.h5" for s in schemes} | {f"data/{s}-sweep.h5" for s in dynamics}
    out |= {f"data/{s}-long.h5" for s in long}
    out |= {f"data/{s}-pos-{n}.h5" for s in positional for n in ("short", "long")}
    figures = [f"{s}_{k}" for s in schemes for k in ("bias", "weights", "profile")]
    figures += [f"{s}_dynamics" for s in dynamics] + ["diagnostics", "long_context", "positional", "position_measures"]
    out |= {f"figures/{f}.{ext}" for f in figures for ext in ("pdf", "png")}
    out |= {"figures/position_measures.tex"}  # its caption (measures_page --caption)
    return out | {f"figures/{s}_explore.html" for s in schemes} | {"figures/diagnostics.json"}


def readme_commands() -> list[list[str]]:
    """Every biasviz command of the shell blocks of README and the site's pages, in reading order (the two set-up
    commands, ``make figures`` and ``make test``, are make's)."""
    commands = []
    for _, block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if "biasviz" in words and words[0] in ("biasviz", "torchrun"):
                commands.append(words[words.index("biasviz") :])
    return commands


def option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def positional_args(words: list[str]) -> list[str]:
    """A command's positional arguments (FILE.h5 ... of diagnose, explore, info)."""
    flags = {"--force", "--summary", "--bias-only", "--quiet", "--no-scale", "--resume", "--log", "--log-distance"}
    args, skip = [], False
    for w in words[2:]:
        if skip:
            skip = False
        elif w.startswith("--"):
            skip = w not in flags
        else:
            args.append(w)
    return args


def inputs_and_output(words: list[str]) -> tuple[list[str], str | None]:
    """The files a command reads, and the one output it refuses to replace without --force (None: it has none)."""
    verb = words[1]
    if verb == "train":
        return [], option(words, "--out")
    if verb == "extract":
        model = option(words, "--model")
        return [model], option(words, "--out") or f"data/{option(words, '--scheme')}.h5"
    if verb == "plot":
        return [option(words, "--input") or f"data/{option(words, '--scheme')}.h5"], None
    files = positional_args(words)
    if verb == "diagnose":
        return files, option(words, "--json") or f"{option(words, '--out-dir') or 'figures'}/diagnostics.json"
    if verb == "explore":
        return files, option(words, "--out") or f"figures/{Path(files[0]).stem}_explore.html"
    return files, None


def plot_stems(words: list[str]) -> list[str]:
    """The figures (``OUT_DIR/SCHEME_WHAT``, any format) a ``plot`` command writes, by its kind."""
    kind = option(words, "--kind") or "bias"
    whats = {"all": ["bias", "weights"], "std": ["bias_std", "weights_std"],
             "profile": ["bias_profile", "weights_profile"]}.get(kind, [kind])  # fmt: skip
    return [f"{option(words, '--out-dir') or 'figures'}/{option(words, '--scheme')}_{w}" for w in whats]


def test_python_versions_agree() -> None:
    wanted = re.search(r'requires-python = ">=(\d+\.\d+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    said = re.findall(r"Python (\d+\.\d+)\+", MAKEFILE)
    assert said and set(said) == {wanted}, said
    assert f"Python ≥ {wanted}" in README


def test_every_readme_example_finds_its_output_free_after_make_figures() -> None:
    made = make_figures_outputs()
    present = set(made)
    ran, own_files = [], []
    for words in readme_commands():
        inputs, output = inputs_and_output(words)
        if not all(i in present for i in inputs):  # reads your own files (ckpt.pt, ~/models/..., a hub cache)
            own_files.append(" ".join(words))
            continue
        ran.append(" ".join(words))
        if words[1] == "plot":  # never into make figures' own folder; and a figure set of an earlier example
            assert (option(words, "--out-dir") or "figures") != "figures", words  # is refused without --force
            for stem in plot_stems(words):
                assert stem not in present or "--force" in words, f"{' '.join(words)}: {stem}.* exist; refused"
                present.add(stem)
        if output is None:
            continue
        assert output not in made, f"{' '.join(words)}: replaces {output}, which make figures wrote"
        assert output not in present or "--force" in words, f"{' '.join(words)}: {output} exists; it is refused"
        present.add(output)
    # the walk really covers the sequence: training dynamics, summaries, positional logits and the explorer
    for needed in ("train --scheme kerple-log", "--kind dynamics", "--bias-only", "explore data/cable.h5"):
        assert any(needed in r for r in ran), needed
    assert any("ckpt.pt" in c for c in own_files)


def test_python_examples_write_nothing_make_figures_made() -> None:
    made = make_figures_outputs()
    code = "\n".join(code for _, code in blocks("python"))
    written = re.findall(r"""(?:\.save|savefig|extract)\([^)]*?["']((?:data|figures|runs)/[^"']+)["']""", code)
    assert written, "the python blocks write files"
    assert not set(written) & made, set(written) & made


@pytest.fixture
def after_make(tmp_path: Path, make_bias_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding, where make figures puts them, a data file, its explorer page, a run and a sweep."""
    from tests.conftest import small_model

    make_bias_file(tmp_path / "data" / "cable.h5", "cable", t=16)
    (tmp_path / "data" / "kerple-log-sweep.h5").write_bytes((tmp_path / "data" / "cable.h5").read_bytes())
    small_model("kerple-log").save_pretrained(tmp_path / "runs" / "kerple-log")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow
def test_existing_outputs_are_refused_and_readme_examples_run(after_make: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """The rule the walk above relies on, on the real commands; then README's explorer examples, as written."""
    code, _, err = run_cli(["explore", "data/cable.h5"], capsys)
    assert code == 0, err
    page = (after_make / "figures" / "cable_explore.html").read_bytes()
    refused = [["explore", "data/cable.h5"],
               ["train", "--scheme", "kerple-log", "--steps", "300", "--save-every", "100", "--out", "runs/kerple-log"],
               ["extract", "--model", "runs/kerple-log", "--checkpoints", "all", "--out", "data/kerple-log-sweep.h5"]]
    for args in refused:  # the commands README gave before: each now meets what make figures wrote
        code, _, err = run_cli(args, capsys)
        assert code != 0 and "--force" in err, (args, err)
    examples = [w for w in readme_commands() if w[1] == "explore"]
    assert examples
    for words in examples:
        code, _, err = run_cli(words[1:], capsys)
        assert code == 0, (words, err)
    assert (after_make / "figures" / "cable_explore.html").read_bytes() == page
