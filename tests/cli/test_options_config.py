"""``--config FILE.toml``: defaults from a file, command-line options win; per-stage files for make."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from biasviz.cli.options import config_option, write_stage


@click.command("plot")
@config_option
@click.option("--scheme", required=True)
@click.option("--format", "formats_text", default="pdf,png")
@click.option("--dpi", default=200, type=int)
def fake_plot(scheme: str, formats_text: str, dpi: int) -> None:
    click.echo(f"{scheme} {formats_text} {dpi}")


CONFIG = """
scheme = "fire"            # top level: every command that has --scheme
[train]
steps = 10                 # another command's table is ignored here
[plot]
format = "pdf"
dpi = 300
"""


def run(tmp_path, *args: str) -> tuple[int, str]:
    path = tmp_path / "c.toml"
    if not path.exists():
        path.write_text(CONFIG)
    result = CliRunner().invoke(fake_plot, ["--config", str(path), *args], prog_name="plot")
    return result.exit_code, result.output.strip()


def test_config_sets_defaults_and_the_command_line_wins(tmp_path) -> None:
    assert run(tmp_path) == (0, "fire pdf 300")
    assert run(tmp_path, "--dpi", "72", "--scheme", "alibi") == (0, "alibi pdf 72")


def test_unknown_key_in_the_command_table_is_an_error(tmp_path) -> None:
    (tmp_path / "c.toml").write_text('[plot]\ncolour = "red"\n')
    code, out = run(tmp_path, "--scheme", "t5")
    assert code == 2 and "unknown key(s) colour in [plot]" in out


@pytest.mark.parametrize("text", ["scheme = ", "[plot]\ndpi = 3\n[plot]\n"])
def test_invalid_toml_is_a_usage_error(tmp_path, text: str) -> None:
    (tmp_path / "c.toml").write_text(text)
    code, out = run(tmp_path, "--scheme", "t5")
    assert code == 2 and "not valid TOML" in out


def test_stage_file_changes_only_when_its_part_changes(tmp_path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(CONFIG)
    stage = tmp_path / "plot.json"
    assert write_stage(config, "plot", stage) is True
    assert write_stage(config, "plot", stage) is False  # unchanged: make sees an old file
    config.write_text(CONFIG.replace("steps = 10", "steps = 20"))  # only [train] changed
    assert write_stage(config, "plot", stage) is False
    config.write_text(CONFIG.replace("dpi = 300", "dpi = 600"))
    assert write_stage(config, "plot", stage) is True


def test_shipped_configs_are_accepted_by_every_command(tmp_path) -> None:
    from pathlib import Path

    from biasviz.cli import cli

    root = Path(__file__).resolve().parents[2]
    configs = sorted((root / "configs").glob("*.toml"))
    assert {c.stem for c in configs} == {"alibi", "kerple-log", "fire", "t5", "cable", "rope", "nope"}
    for path in configs:
        for command in ("train", "extract", "plot"):
            result = CliRunner().invoke(cli, [command, "--config", str(path), "--help"])
            assert result.exit_code == 0, (path.name, command, result.output)
