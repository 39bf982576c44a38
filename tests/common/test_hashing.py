"""The weights' SHA-256 begun early (while a model's load imports) is the file's digest, or is taken again."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from biasviz.common import hashing
from biasviz.common.hashing import sha256_file, start_hashing


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def weights(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    path.write_bytes(os.urandom(3 << 20) + b"tail")
    return path


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="begun early only where a second core is free")
def test_a_digest_begun_early_is_the_file_s(weights: Path) -> None:
    start_hashing([weights])
    assert len(hashing._started) >= 1
    assert sha256_file(weights) == digest(weights)
    assert not any(key[0] == str(weights.resolve()) for key in hashing._started)  # taken up once


def test_a_file_changed_after_its_digest_began_is_hashed_again(weights: Path) -> None:
    start_hashing([weights])
    stat = weights.stat()
    weights.write_bytes(b"other weights of the same length".ljust(stat.st_size, b"\0"))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert sha256_file(weights) == digest(weights)


def test_a_file_that_cannot_be_read_is_the_caller_s_error(tmp_path: Path) -> None:
    missing = tmp_path / "gone.safetensors"
    start_hashing([missing])  # nothing to begin: no error here
    with pytest.raises(OSError):
        sha256_file(missing)


def test_a_loaded_checkpoint_records_its_weights_digest(tmp_path: Path) -> None:
    """``load_model`` begins the digest before the load and records it: the file's own SHA-256."""
    from biasviz.adapters import load_model
    from tests.conftest import small_model

    small_model("alibi").save_pretrained(tmp_path / "model")
    adapter = load_model(tmp_path / "model")
    assert adapter.sha256 == digest(tmp_path / "model" / "model.safetensors")
