"""One config file drives every ``plot --kind``: its options that do not apply to the kind asked are left out,
while the same options typed on the command line are still usage errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # whole CLI runs and figures rendered: make test-fast leaves them out


@pytest.fixture(scope="module")
def fire_file(tmp_path_factory: pytest.TempPathFactory, make_bias_file: Callable[..., Path]) -> Path:
    return make_bias_file(tmp_path_factory.mktemp("cfg") / "fire.h5", "fire", heads=4, t=16)


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


@pytest.mark.parametrize(("kind", "option"), [("bias", ["--log"]), ("weights", ["--normalize", "diagonal"]),
                                              ("bias", ["--log-distance"]), ("profile", ["--sample", "1"])],
                         ids=["log-bias", "normalize-weights", "log-distance-bias", "sample-profile"])  # fmt: skip
def test_options_typed_on_the_command_line_that_do_not_apply_are_errors(
    kind: str, option: list[str], fire_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(CONFIG)
    for args in ([*option, "--kind", kind], ["--config", str(config), *option, "--kind", kind]):
        code, err = plot(args, fire_file, tmp_path / "out", capsys)
        assert code == 2 and option[0] in err, err
        assert not (tmp_path / "out").exists()


# every option that does not apply to one of the kinds below, from a config
CONFIG = '[plot]\nnormalize = "diagonal"\nlog = true\nlog_distance = true\nsample = "1"\n'


@pytest.mark.parametrize("kind", ["weights", "profile"])
def test_config_options_are_left_out_where_they_do_not_apply_and_kept_where_they_do(
    kind: str, fire_file: Path, tmp_path: Path, figures: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    """weights: normalize, log_distance and sample left out, log kept; profile: sample left out, the rest kept."""
    from matplotlib.colors import LogNorm

    config = tmp_path / "c.toml"
    config.write_text(CONFIG)
    code, err = plot(["--config", str(config), "--kind", kind], fire_file, tmp_path / "out", capsys)
    assert code == 0, err
    if kind == "weights":
        norms = [im.norm for ax in figures["fire_weights"].axes for im in ax.get_images()]
        assert norms and all(isinstance(n, LogNorm) for n in norms)  # log = true applies to the weights
    else:
        assert sorted(figures) == ["fire_bias_profile", "fire_weights_profile"]
        axis = figures["fire_bias_profile"].axes[0]
        assert axis.get_xscale() in ("log", "symlog")  # log_distance = true applies to a profile
