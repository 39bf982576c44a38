"""A placed model reads no weight it keeps on the disk (biasviz.adapters.offload_reads, and the probe of
biasviz.adapters.probe_reads): with --layer 1, layers on the disk after it are read neither while loading, nor by
the probe that counts a traced model's attention calls, nor by the capture pass; the placed run's cells equal the
in-memory run's. The tiny saved Llama- and BLOOM-shaped models and their layouts are test_device_map.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

import biasviz
from tests.adapters import test_device_map
from tests.adapters.test_device_map import LAYOUTS, _assert_same_cells, _ids, _in_memory

pytest.importorskip("accelerate")

models = test_device_map.models  # the saved models of test_device_map.py, a fixture of this file's own


@pytest.mark.parametrize("shape", ["llama", "bloom"])
def test_the_forward_stops_before_later_layers_are_read_from_disk(models, shape: str, monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:  # fmt: skip
    """--layer 1: layers 2 and 3 (on the disk) are never read: not when loading, not by the probe that counts a
    traced model's (Llama's) attention calls, not by the capture pass; the loader reads the layers kept in memory."""
    import transformers.modeling_utils as loading
    from accelerate.utils import offload

    read: list[str] = []
    loaded: list[str] = []
    original, opened = offload.OffloadedWeightsLoader.__getitem__, loading.safe_open

    def recording(self: object, key: str) -> object:
        read.append(key)
        return original(self, key)

    class Slice:  # a checkpoint tensor as the loader sees it: reading it (t[...]) is recorded
        def __init__(self, inner: object, key: str) -> None:
            self.inner, self.key = inner, key

        def __getitem__(self, index: object) -> object:
            loaded.append(self.key)
            return self.inner[index]

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

    class File:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.inner = opened(*args, **kwargs)

        def get_slice(self, key: str) -> Slice:
            return Slice(self.inner.get_slice(key), key)

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        def __exit__(self, *exc: object) -> object:
            return self.inner.__exit__(*exc)

    monkeypatch.setattr(offload.OffloadedWeightsLoader, "__getitem__", recording)
    monkeypatch.setattr(loading, "safe_open", File)
    out = tmp_path / "one.h5"
    biasviz.extract(models[shape], _ids(), out, layers=1, device_map=LAYOUTS[shape], progress=False)
    captured = "model.layers.1." if shape == "llama" else "h.1."
    assert any(k.startswith(captured) for k in read)  # the captured layer came from the disk
    later = sorted({k for k in read if not k.startswith(captured)})
    assert not later, f"read from the disk beside the captured layer: {later}"
    on_disk = [m + "." for m, d in LAYOUTS[shape].items() if d == "disk"]
    in_memory = [m + "." for m, d in LAYOUTS[shape].items() if d == "cpu" and "rotary" not in m]
    for module in in_memory:  # the loader read these (the recording sees what it reads)
        assert any(k.removeprefix("transformer.").startswith(module) for k in loaded), (module, loaded)
    unread = sorted(k for k in loaded if any(k.removeprefix("transformer.").startswith(m) for m in on_disk))
    assert not unread, f"read while loading, though they stay on the disk: {unread}"
    _assert_same_cells(out, _in_memory(models[shape], tmp_path, layers=1))
