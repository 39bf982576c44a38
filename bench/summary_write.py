"""Writing a summary's maps: h5py's gzip filter (one thread, chunks of h5py's choosing) against biasviz's writer
(one gzip chunk per head's map, compressed in parallel, stored directly). BENCHMARKS.md section 9.

    .venv/bin/python bench/summary_write.py    # five (12, 1024, 1024) float32 maps, time to close and file size
"""

from __future__ import annotations

import os
import tempfile
import time

import h5py
import numpy as np

from biasviz.store.summary_writer import _write_compressed


def main() -> None:
    rng = np.random.default_rng(0)
    # a cumulative sum of normal noise along keys: a map's kind of smoothness, not incompressible noise
    maps = [np.cumsum(rng.normal(size=(12, 1024, 1024)).astype(np.float32), -1) * 1e-3 for _ in range(5)]
    with tempfile.TemporaryDirectory() as tmp:
        for label in ("h5py filter", "biasviz"):
            path = os.path.join(tmp, "maps.h5")
            t0 = time.perf_counter()
            with h5py.File(path, "w") as f:
                for i, m in enumerate(maps):
                    if label == "biasviz":
                        _write_compressed(f, f"m{i}", m)
                    else:
                        f.create_dataset(f"m{i}", data=m, compression="gzip", compression_opts=1, shuffle=True,
                                         chunks=True)  # fmt: skip
            print(f"{label}: {time.perf_counter() - t0:.2f} s, {os.path.getsize(path) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
