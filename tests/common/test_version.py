"""The version recorded in every file and figure (:mod:`biasviz.common.version`): the installed distribution's, as
importlib.metadata reads it, and a PEP 440 stand-in from a source tree that was never installed."""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest
from packaging.version import Version

import biasviz.common.version as version_module


def test_the_version_is_the_installed_distributions() -> None:
    """The same string the package metadata holds, and one packaging can order (PEP 440)."""
    assert version_module.__version__ == importlib.metadata.version("biasviz")
    Version(version_module.__version__)


def test_an_uninstalled_tree_has_a_pep440_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without metadata the module still imports, and its version is valid PEP 440 that sorts below any release."""

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    try:
        with monkeypatch.context() as patched:
            patched.setattr(importlib.metadata, "version", missing)
            importlib.reload(version_module)
            got = version_module.__version__
    finally:  # read again unpatched, so that the stand-in does not outlive the test
        importlib.reload(version_module)
    assert got == "0.0.0+unknown"
    assert Version(got) < Version("0.0.1")
    assert version_module.__version__ == importlib.metadata.version("biasviz")
