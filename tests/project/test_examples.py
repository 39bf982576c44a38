"""The notebooks of examples/ run as stored, in a Jupyter kernel (nbclient), on tiny models and files.

Each runs in a folder laid out as the clone is after ``make figures`` (``runs/rope`` with its tokenizer,
``data/kerple-log-sweep.h5``), made here from small random models; only the cell tagged ``parameters`` is
changed, to a length a test can afford. What the cells print is checked against h5py reads and the formulas
of the schemes, never against what biasviz itself returns.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

nbformat = pytest.importorskip("nbformat", reason="needs nbformat, nbclient and ipykernel (pip install -e '.[dev]')")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.ipynb"))
#: what each notebook's parameters cell becomes here (the stored values are make figures' own)
PARAMETERS = {"02_long_context.ipynb": {"SEQ_LEN": 64, "SAMPLES": 4, "RESOLUTION": 32}}


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with what the notebooks read after ``make figures``: a RoPE run and a KERPLE-log sweep."""
    from biasviz.data import build_tokenizer, save_tokenizer
    from biasviz.extraction.sweep import extract_sweep
    from tests.conftest import small_model

    root = tmp_path_factory.mktemp("clone")
    run = root / "runs" / "rope"
    small_model("rope", vocab_size=300).save_pretrained(run)
    save_tokenizer(build_tokenizer(["def f(x):\n    return x + 1\n" * 50], vocab_size=300), run)
    sweep = root / "runs" / "kerple-log"
    for k, step in enumerate((0, 100, 200)):
        small_model("kerple-log", seed=k).save_pretrained(sweep / f"checkpoint-{step}")
    windows = np.random.default_rng(0).integers(0, 97, size=(2, 24))
    extract_sweep(sweep, "all", windows, root / "data" / "kerple-log-sweep.h5", device="cpu", progress=False)
    (root / "examples").mkdir()
    return root


def stored_notebook(path: Path) -> object:
    return nbformat.read(path, as_version=4)


def run_notebook(path: Path, folder: Path) -> object:
    """Execute ``path`` with ``folder`` as its working directory; its parameters cell set for a test."""
    nb = stored_notebook(path)
    for cell in nb.cells:
        if "parameters" in cell.metadata.get("tags", []):
            for name, value in PARAMETERS.get(path.name, {}).items():
                cell.source, n = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", cell.source, flags=re.M)
                assert n == 1, (path.name, name)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}}).execute()  # fmt: skip
    return nb


def text_of(nb: object) -> str:
    """Everything the cells printed, and the text form of what they returned."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.append(out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def test_three_notebooks_are_stored_without_outputs() -> None:
    assert [p.name for p in EXAMPLES] == ["01_your_model.ipynb", "02_long_context.ipynb", "03_checkpoint_sweep.ipynb"]
    for path in EXAMPLES:
        raw = json.loads(path.read_text())
        for cell in raw["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, path.name


@pytest.fixture(scope="module")
def executed(clone: Path) -> dict[str, object]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(EXAMPLES)) as pool:  # one kernel each, side by side: most of it is start-up
        runs = {p.name: pool.submit(run_notebook, p, clone / "examples") for p in EXAMPLES}
        return {name: run.result() for name, run in runs.items()}


def test_no_cell_prints_a_progress_bar_or_a_warning(executed: dict[str, object]) -> None:
    """The notebooks pass progress=False: nothing on stderr, neither transformers' "Loading weights" bar nor the
    TqdmWarning that tqdm.auto gives in a kernel without ipywidgets."""
    for name, nb in executed.items():
        texts = [(o.get("name"), o.get("text", "")) for c in nb.cells for o in c.get("outputs", [])]
        errs = [text for stream, text in texts if stream == "stderr"]
        bars = [text for _, text in texts if re.search(r"it/s\]|%\|", text)]
        assert errs == [] and bars == [], (name, errs, bars)


def test_your_model_notebook_traces_explores_and_stores(executed: dict[str, object], clone: Path) -> None:
    nb = executed["01_your_model.ipynb"]
    text = text_of(nb)
    # the bias of head 1, query 5, keys 0-2 is -m_1 * (5, 4, 3) with m_1 = 2^(-8/12)
    printed = re.search(r"keys 0-2: \[(.*?)\]", text).group(1)
    assert np.allclose([float(x) for x in printed.split(",")], -(2 ** (-8 / 12)) * np.array([5, 4, 3]), atol=1e-5)
    htmls = [o["data"]["text/html"] for c in nb.cells for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    assert len(htmls) == 1 and htmls[0].startswith("<iframe srcdoc=")  # the page, inline; no server, no file
    with h5py.File(clone / "examples" / "my_model.h5") as f:
        slopes = 2.0 ** (-8 * np.arange(1, 13) / 12)
        d = np.arange(64)[:, None] - np.arange(64)[None, :]
        want = np.where(d >= 0, -slopes[:, None, None] * d, np.nan)
        assert np.allclose(f["layer_1/bias"][0], want, equal_nan=True, atol=1e-5)
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 1  # the figure view.plot returned, shown inline


def test_long_context_notebook_draws_what_the_summary_holds(executed: dict[str, object], clone: Path) -> None:
    nb = executed["02_long_context.ipynb"]
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 3  # positional, profile (one or more), sinks
    with h5py.File(clone / "examples" / "rope-long.h5") as f:
        assert f.attrs["summary"] and f.attrs["seq_len"] == 64 and f.attrs["samples"] == 4
        layer = f"layer_{f.attrs['layers'][-1]}"
        share = f[f"{layer}/sink_share"][()].mean(axis=0)
        profile = f[f"{layer}/positional_profile"][0, 0, :4]
    text = text_of(nb)
    got = re.search(r"share of key 0 per head: \[(.*?)\]", text, re.S).group(1).split()
    assert np.allclose([float(x) for x in got], np.round(share, 3), atol=1e-3)
    got = re.search(r"d = 0, 1, 2, 3: \[(.*?)\]", text, re.S).group(1).split()
    assert np.allclose([float(x) for x in got], np.round(profile, 3), atol=1e-3)
    assert any(o.get("data", {}).get("text/html", "").startswith("<iframe srcdoc=") for c in nb.cells
               for o in c.get("outputs", []))  # fmt: skip


def test_sweep_notebook_reads_every_step(executed: dict[str, object], clone: Path) -> None:
    nb = executed["03_checkpoint_sweep.ipynb"]
    text = text_of(nb)
    with h5py.File(clone / "data" / "kerple-log-sweep.h5") as f:
        steps = [int(s) for s in f["checkpoint"][()]]
        bias = f[f"layer_{f.attrs['layers'][-1]}/bias"][()]  # (checkpoint, 1 or sample, head, query, key)
    assert f"steps: {steps}" in text
    for index, step in enumerate(steps):
        mean = bias[index].mean(axis=0)[0]  # head 1: (query, key)
        want = [np.mean(np.diagonal(mean, -d)) for d in (1, 8, 16)]
        got = re.search(rf"step\s+{step}: head 1 b\(d\) at d = 1, 8, 16 -> \[(.*?)\]", text).group(1).split()
        assert np.allclose([float(x) for x in got], np.round(want, 4), atol=1e-4), step
    assert "('checkpoint', 'sample', 'head', 'query', 'key')" in text


# -- the inline explorer, as a reader of the exported notebook sees it ------------------------------------------


@pytest.fixture(scope="module")
def browser() -> object:
    explore_browser = pytest.importorskip("tests.explorer.test_page_browser")  # skips without selenium
    if explore_browser.CHROMIUM is None or explore_browser.CHROMEDRIVER is None:
        pytest.skip("needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)")
    drv = explore_browser.make_driver()
    yield drv
    drv.quit()


def hover_in_frame(drv: object, frame: object, canvas_css: str, i: int, j: int, t: int) -> str:
    """Move the mouse over cell (i, j) of a grid canvas inside ``frame``; the read-out's text."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.common.by import By

    from tests.explorer.test_page_browser import wait_for

    drv.switch_to.frame(frame)
    canvas = drv.find_element(By.CSS_SELECTOR, canvas_css)
    drv.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)  # scrolls the notebook too
    left, top, width, height = drv.execute_script(
        "const c = arguments[0], r = c.getBoundingClientRect();"
        "return [r.left + c.clientLeft, r.top + c.clientTop, c.clientWidth, c.clientHeight]", canvas)  # fmt: skip
    drv.switch_to.default_content()
    x0, y0 = drv.execute_script("const f = arguments[0], r = f.getBoundingClientRect();"
                                "return [r.left + f.clientLeft, r.top + f.clientTop]", frame)  # fmt: skip
    actions = ActionBuilder(drv)  # pointer positions are the notebook's viewport's: the frame's offset added
    actions.pointer_action.move_to_location(round(x0 + left + (j + 0.5) / t * width),
                                            round(y0 + top + (i + 0.5) / t * height))  # fmt: skip
    actions.perform()
    drv.switch_to.frame(frame)
    wait_for(drv, f"const r = document.getElementById('readout').dataset; return r.query === '{i}' && r.key === '{j}'")
    text = drv.find_element(By.ID, "readout").get_attribute("textContent")
    drv.switch_to.default_content()
    return text


def test_the_exported_notebook_shows_the_explorer_with_12_heads_and_a_working_readout(
        executed: dict[str, object], clone: Path, browser: object, tmp_path: Path) -> None:  # fmt: skip
    from nbconvert import HTMLExporter
    from selenium.webdriver.common.by import By

    from tests.explorer.test_page_browser import wait_for

    body, _ = HTMLExporter().from_notebook_node(executed["01_your_model.ipynb"])
    page = tmp_path / "01_your_model.html"
    page.write_text(body, encoding="utf-8")
    browser.get(page.as_uri())
    frames = browser.find_elements(By.TAG_NAME, "iframe")
    assert len(frames) == 1
    browser.switch_to.frame(frames[0])
    wait_for(browser, "return document.body.dataset.ready === '1'")
    heads = [c.get_attribute("data-head") for c in browser.find_elements(By.CSS_SELECTOR, "#grid canvas[data-head]")]
    assert heads == [str(h) for h in range(1, 13)]
    browser.switch_to.default_content()
    with h5py.File(clone / "examples" / "my_model.h5") as f:  # the ids the notebook ran the model on
        ids = f["input_ids"][0]
    for head, i, j in [(3, 40, 17), (12, 63, 0), (1, 9, 8)]:
        text = hover_in_frame(browser, frames[0], f'#grid canvas[data-head="{head}"]', i, j, 64)
        value = -(2.0 ** (-8 * head / 12)) * (i - j)  # ALiBi, from its definition
        assert f"head {head} · query i = {i} · key j = {j} · d = i - j = {i - j}" in text, text
        assert f"value {format(value, '.4g')} (exact)" in text, text
        assert f"query id {ids[i]}, key id {ids[j]}" in text, text
    # the exporter's own template asks a CDN for MathJax and require.js; nothing else may fail
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert [e for e in errors if "cdnjs.cloudflare.com" not in e] == []
