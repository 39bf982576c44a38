"""One config file drives every ``plot --kind``: its options that do not apply to the kind asked are left out,
while the same options typed on the command line are still usage errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fire_file(tmp_path_factory: pytest.TempPathFactory, make_bias_file: Callable[..., Path]) -> Path:
    return make_bias_file(tmp_path_factory.mktemp("cfg") / "fire.h5", "fire", t=16)


def plot(args: list[str], file: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code, _, err = run_cli(["plot", "--scheme", "fire", "--input", str(file), "--format", "png", "--dpi", "50",
                            "--out-dir", str(out), *args], capsys)  # fmt: skip
    return code, err


def test_the_shipped_fire_config_plots_the_bias_alone(fire_file: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    # configs/fire.toml says log = true (for its weights) and kind = "all"; --kind bias must not trip on it
    code, err = plot(["--config", str(ROOT / "configs" / "fire.toml"), "--kind", "bias"], fire_file, tmp_path, capsys)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fire_bias.png"]


@pytest.mark.parametrize(
    ("table", "kind", "option"),
    [("log = true", "bias", ["--log"]), ('normalize = "diagonal"', "weights", ["--normalize", "diagonal"]),
     ("log_distance = true", "bias", ["--log-distance"]), ('sample = "1"', "profile", ["--sample", "1"])],
    ids=["log-bias", "normalize-weights", "log-distance-bias", "sample-profile"],
)  # fmt: skip
def test_config_options_that_do_not_apply_are_left_out_but_typed_ones_are_errors(
    table: str, kind: str, option: list[str], fire_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f"[plot]\n{table}\n")
    code, err = plot(["--config", str(config), "--kind", kind], fire_file, tmp_path / "a", capsys)
    assert code == 0, err
    assert any((tmp_path / "a").glob("fire_*.png"))
    code, err = plot([*option, "--kind", kind], fire_file, tmp_path / "b", capsys)
    assert code == 2 and option[0] in err, err
    assert not (tmp_path / "b").exists()
    # with the config too, the command line's value is still refused
    code, err = plot(["--config", str(config), *option, "--kind", kind], fire_file, tmp_path / "c", capsys)
    assert code == 2 and option[0] in err, err


def test_a_config_option_that_applies_still_takes_effect(fire_file: Path, tmp_path: Path,
                                                        figures: dict[str, object],
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """log = true from the config is kept for the weights: their colour scale is logarithmic."""
    from matplotlib.colors import LogNorm

    config = tmp_path / "c.toml"
    config.write_text("[plot]\nlog = true\n")
    code, err = plot(["--config", str(config), "--kind", "weights"], fire_file, tmp_path / "w", capsys)
    assert code == 0, err
    fig = figures["fire_weights"]
    norms = [im.norm for ax in fig.axes for im in ax.get_images()]
    assert norms and all(isinstance(n, LogNorm) for n in norms)
