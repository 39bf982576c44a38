"""Small PNG previews of the figures, for README and slides: ``python -m biasviz.plotting.preview SRC DST``."""

from __future__ import annotations

import sys
from pathlib import Path

from PIL import Image

from biasviz.common.atomic import replacing

PREVIEW_WIDTH = 520  # pixels: sharp on a README page, a few hundred kB at most
PREVIEWS = ("*_bias.png", "*_weights.png", "diagnostics.png", "cable_bias_profile.png", "*_dynamics.png",
            "long_context.png", "positional.png", "position_measures.png")


def make_previews(src: str | Path, dst: str | Path, width: int = PREVIEW_WIDTH) -> list[Path]:
    """Downscale the figures' PNGs in ``src`` into ``dst`` (Lanczos; palette-quantised to stay small)."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    for pattern in PREVIEWS:
        for path in sorted(src.glob(pattern)):
            with Image.open(path) as im:
                im = im.convert("RGB")
                height = round(im.height * width / im.width)
                small = im.resize((width, height), Image.Resampling.LANCZOS).quantize(colors=128)
                out = dst / path.name
                with replacing(out) as tmp:
                    small.save(tmp, format="PNG", optimize=True)
                written.append(out)
    return written


if __name__ == "__main__":
    for p in make_previews(*sys.argv[1:3]):
        print(f"wrote {p}")
