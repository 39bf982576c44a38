"""README's previews (:mod:`biasviz.plotting.preview`): the figures' PNGs that match its patterns, each scaled to the
preview width with its aspect kept, the rest left alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from PIL import Image

from biasviz.plotting.preview import PREVIEW_WIDTH, make_previews


def png(path: Path, size: tuple[int, int], colour: tuple[int, int, int]) -> Path:
    Image.new("RGB", size, colour).save(path)
    return path


def test_the_figures_pngs_are_scaled_to_the_preview_width(tmp_path: Path) -> None:
    src, dst = tmp_path / "figures", tmp_path / "previews" / "deep"
    src.mkdir()
    png(src / "alibi_bias.png", (1040, 300), (200, 30, 30))
    png(src / "cable_weights.png", (2000, 1000), (10, 120, 200))
    png(src / "diagnostics.png", (700, 510), (0, 0, 0))
    png(src / "alibi_bias_profile.png", (1000, 500), (0, 0, 0))  # a profile other than CABLE's: no preview
    png(src / "alibi_std.png", (1000, 500), (0, 0, 0))
    (src / "alibi_bias.pdf").write_bytes(b"%PDF")
    written = make_previews(src, dst)
    assert PREVIEW_WIDTH == 520
    assert [p.name for p in written] == ["alibi_bias.png", "cable_weights.png", "diagnostics.png"]
    assert sorted(p.name for p in dst.iterdir()) == ["alibi_bias.png", "cable_weights.png", "diagnostics.png"]
    for name, height in (("alibi_bias.png", 150), ("cable_weights.png", 260), ("diagnostics.png", 379)):
        with Image.open(dst / name) as im:  # 300 * 520 / 1040, 1000 * 520 / 2000, round(510 * 520 / 700 = 378.9)
            assert im.size == (520, height), name
            assert im.mode == "P" and len(im.getcolors()) <= 128  # quantised to a palette of at most 128 colours
    with Image.open(dst / "alibi_bias.png") as im:
        assert im.convert("RGB").getpixel((260, 75)) == (200, 30, 30)  # a flat colour stays that colour


def test_a_width_of_ones_own_and_the_command_line(tmp_path: Path) -> None:
    src = tmp_path / "figures"
    src.mkdir()
    png(src / "long_context.png", (400, 200), (255, 255, 255))
    (out,) = make_previews(str(src), str(tmp_path / "small"), width=100)
    with Image.open(out) as im:
        assert im.size == (100, 50)
    proc = subprocess.run([sys.executable, "-m", "biasviz.plotting.preview", str(src), str(tmp_path / "cli")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"wrote {tmp_path / 'cli' / 'long_context.png'}\n"
    with Image.open(tmp_path / "cli" / "long_context.png") as im:
        assert im.size == (520, 260)
