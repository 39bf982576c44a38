"""The GPU run (bench/gpu_run.py), rehearsed on the CPU: every part, every table, each part bounded in time."""

from __future__ import annotations

import ast
import json
import re
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_run  # noqa: E402

pytestmark = pytest.mark.slow  # children and end-to-end runs

# one length of our model is enough to rehearse the code path (the GPU run takes three); the device map part runs
# in a child of its own below, as every part does on the GPU
REHEARSED = ["cuda_tests", "ours-4096", "schemes", "llama", "dense"]


@pytest.fixture(scope="module")
def dry(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("gpu")
    return out, gpu_run.run(out, dry=True, only=REHEARSED, inline=True)


def test_the_dry_run_measures_every_part_and_skips_only_cuda(dry: tuple[Path, list[dict]]) -> None:
    out, rows = dry
    assert json.loads((out / "gpu_results.json").read_text())["rows"] == rows
    by_part: dict[str, list[dict]] = {}
    for row in rows:
        by_part.setdefault(row["part"], []).append(row)
    assert set(by_part) == {"cuda_tests", "ours", "schemes", "llama", "dense"}
    assert [r["status"] for r in by_part["cuda_tests"]] == ["skipped: no CUDA device"]
    measured = [r for r in rows if r["part"] != "cuda_tests"]
    assert all(r["status"].startswith("ok") for r in measured), [r["status"] for r in measured]
    assert all(min(r["times"]) > 0 and r["peak_gib"] > 0 for r in measured)
    ours = {(r["dtype"], r["tool"]) for r in by_part["ours"]}
    tools = ("flash-sdpa forward", "ours forward", "ours summary", "ours summary, torch statistics",
             "flash-sdpa train step", "ours train step")  # fmt: skip
    assert ours == {(d, t) for d in gpu_run.DRY.dtypes for t in tools}
    # on a CPU both summaries take the torch path (the fused kernels run on a GPU), and say so
    assert {r["statistics"] for r in by_part["ours"] if "summary" in r["tool"]} == {"torch"}
    assert {r["tool"] for r in by_part["llama"]} == {"bare forward", "traced summary", "output_attentions"}
    # each form of bias, forward and training step, with the route each took (a CPU: the table, the recomputation)
    schemes = {(r["scheme"], r["tool"]): r for r in by_part["schemes"]}
    assert set(schemes) == {(s, f"{t} {p}") for s in gpu_run.SCHEME_ROWS for t in ("flash-sdpa", s)
                            for p in ("forward", "train")}  # fmt: skip
    routes = {(s, p): schemes[s, f"{s} {p}"]["route"] for s in gpu_run.SCHEME_ROWS for p in ("forward", "train")}
    # (a CPU keeps the dry run's small attention whole; a GPU trains through flex)
    assert all(routes[s, "train"].startswith("dense x") for s in gpu_run.SCHEME_ROWS), routes
    assert routes[("t5", "forward")].startswith("table x") and routes[("cable", "forward")].startswith("blocked x")
    ours_step = next(r for r in by_part["ours"] if r["tool"] == "ours train step")
    assert ours_step["route"].startswith("dense x"), ours_step["route"]
    assert [r["T"] for r in by_part["dense"]] == list(gpu_run.DRY.dense_lengths)
    assert all("need CUDA" in r["phases"] for r in by_part["dense"])  # the GPU encoder's phases are CUDA's
    # the summaries measured what a summary holds by default: scores and, with two samples, positional logits
    for row in by_part["ours"] + by_part["llama"]:
        if "summary" in row["tool"]:
            assert {"scores_mean", "positional_mean", "weights_mean"} <= set(row["stored"].split(","))


def test_the_tables_give_each_row_against_its_floor(dry: tuple[Path, list[dict]]) -> None:
    out, rows = dry
    text = (out / "gpu_tables.md").read_text()
    assert text.startswith("Measured on: ") and "cpu_capability" in text
    floors = {(r["T"], r["dtype"], r["tool"]): statistics.median(r["times"]) for r in rows if r["part"] == "ours"}
    checked = 0
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 9 or cells[0] != "ours" or not cells[5]:
            continue
        T, dtype, tool = int(cells[1]), cells[2], cells[3]
        floor = "flash-sdpa train step" if "train" in tool else "flash-sdpa forward"
        per = 2 if "summary" in tool else 1  # a summary of two samples against two forwards of one
        expected = floors[(T, dtype, tool)] / (per * floors[(T, dtype, floor)])
        assert float(cells[5]) == pytest.approx(expected, abs=0.006), line
        checked += 1
    assert checked == 6 * len(gpu_run.DRY.dtypes)
    assert re.search(r"\| 32 \| [0-9.]+ \[[0-9.]+\] \| skipped: the GPU encoder's phases need CUDA", text)
    assert "| pytest -m cuda |  |  |  |  | skipped: no CUDA device |" in text


def test_the_kernels_part_times_them_and_checks_them_against_the_torch_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through Triton's interpreter: K1 and K2 timed beside one layer's flash forward (and with FIRE's MLP, a softcap
    and sinks, CABLE's ends), and the fused statistics within float32 rounding of the torch path's summary, for every
    model the check names. In this process, as the dry run's other parts (a part's child: the device map's test)."""
    pytest.importorskip("triton")
    monkeypatch.setenv("BIASVIZ_STATISTICS", "torch")  # the part sets it for each summary; put back afterwards
    rows = gpu_run.run(tmp_path, dry=True, only=["kernels"], inline=True)
    by_tool = {r["tool"]: r for r in rows}
    for tool in ("flash-sdpa layer forward", "K1 row lse", "K2 tile statistics", "K1 row lse, FIRE's MLP",
                 "K2 tile statistics, FIRE's MLP", "K1 row lse, softcap and sinks", "K2 tile statistics, softcap",
                 "K1 row lse, CABLE's ends", "K2 and K3 tile statistics, CABLE's ends"):
        assert by_tool[tool]["status"] == "ok" and min(by_tool[tool]["times"]) > 0, by_tool.get(tool)
    for scheme in ("alibi", "rope", "fire", "cable", "traced alibi", "traced m·j", "traced cells", "gemma2 softcap",
                   "gpt-oss sinks", "bloom padded"):
        check = by_tool[f"fused vs torch, {scheme}"]
        assert check["status"] == "ok" and check["largest_difference"] < 1e-4, check
    assert "| kernels | 32 | float32 | K2 tile statistics |" in gpu_run.tables(rows, {})


def test_a_part_past_its_limit_is_stopped_and_reported(tmp_path: Path) -> None:
    with open(tmp_path / "log", "w") as log:
        rows = gpu_run.run_part("dense", True, 0.3, log)
    assert [r["status"] for r in rows] == ["timed out after 0 s: rows above are those it finished"]
    assert rows[0]["part_s"] < 5
    assert "## dense" in (tmp_path / "log").read_text()


def test_a_part_runs_in_a_child_of_its_own(tmp_path: Path) -> None:
    """The GPU run's own path: the part in a child process, its rows read back from the child's output."""
    with open(tmp_path / "log", "w") as log:
        rows = gpu_run.run_part("device_map", True, 120, log)
    assert [(r["tool"], r["status"]) for r in rows] == [("device map summary", "ok")]
    assert rows[0]["placement"] == "layers 0-1: cpu, 2-3: disk"


def test_the_session_script_runs_the_dry_run_from_the_shell(tmp_path: Path) -> None:
    """bench/gpu_session.sh passes its options through (here: --help, which starts no part)."""
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_session.sh"), str(tmp_path), "--help"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--dry-run" in done.stdout


def test_no_module_needs_cuda_to_import() -> None:
    """Device-agnostic: no CUDA-only package imported, and no CUDA call made, when a module is imported."""
    cuda_only = {"triton", "flash_attn", "xformers", "apex", "cupy", "pynvml"}
    own = {"triton_kernels", "triton_tiles", "triton_ends"}  # the Triton kernels' own modules ...
    found = []
    for path in sorted((ROOT / "src" / "biasviz").rglob("*.py")):
        if path.parent.name == "kernels" and path.stem in own:  # ... imported only inside the functions that run
            continue  # them (summaries/kernels/__init__.py)
        for sub in _run_at_import(ast.parse(path.read_text()).body):
            if isinstance(sub, ast.ImportFrom) and own & {*(a.name for a in sub.names),
                                                          (sub.module or "").rsplit(".", 1)[-1]}:  # fmt: skip
                found.append(f"{path.name}: imports the Triton kernels at import")
            if isinstance(sub, ast.Import):
                found += [f"{path.name}: import {a.name}" for a in sub.names if a.name.split(".")[0] in cuda_only]
            elif isinstance(sub, ast.ImportFrom) and (sub.module or "").split(".")[0] in cuda_only:
                found.append(f"{path.name}: from {sub.module}")
            elif isinstance(sub, ast.Call) and "torch.cuda." in ast.unparse(sub.func):
                found.append(f"{path.name}:{sub.lineno}: {ast.unparse(sub)}")
    assert not found


def _run_at_import(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """The nodes of a module that run when it is imported: all but function bodies (class bodies run)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from (n for d in node.decorator_list for n in ast.walk(d))
        elif isinstance(node, ast.ClassDef):
            yield from (n for d in node.decorator_list for n in ast.walk(d))
            yield from _run_at_import(node.body)
        else:
            yield from ast.walk(node)
