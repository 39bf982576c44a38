"""README's explorer screenshots (:mod:`biasviz.explorer.screenshot`) of a real page in headless chromium: skipped
where test_page_browser.py is (no chromium, chromedriver or selenium)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.explorer.test_page_browser import files, pytestmark  # noqa: F401  (files: fixture; pytestmark: its skip)


def test_the_screenshot_tool_sets_a_control_already_showing_its_value_and_refuses_one_it_lacks(
        files: dict[str, Path], tmp_path: Path) -> None:  # noqa: F811  # fmt: skip
    """README's screenshots: choosing the kind the page already shows draws nothing new and must not be waited for
    (it timed out after 30 s); a value the page does not offer is one error naming those it does."""
    from biasviz.common.errors import BiasvizError
    from biasviz.explorer.screenshot import screenshot

    out = screenshot(files["page"], tmp_path / "shot.png", select={"kind": "bias"})
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(BiasvizError, match=r"--select kind=logits: the page offers .*bias.*weights"):
        screenshot(files["page"], tmp_path / "bad.png", select={"kind": "logits"})
    assert not (tmp_path / "bad.png").exists()
