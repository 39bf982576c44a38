"""``biasviz explore``: write an interactive, self-contained HTML page of a bias file (README, "Explorer")."""

from __future__ import annotations

from pathlib import Path

import click

from biasviz.cli.options import NonEmptyPath, with_config


@click.command("explore")
@click.argument("files", nargs=-1, required=True, metavar="FILE.h5 [FILE2.h5]",
                type=click.Path(dir_okay=True, path_type=Path))
@click.option("--out", type=NonEmptyPath(dir_okay=False, path_type=Path), default=None,
              help="HTML file to write.  [default: figures/<name>_explore.html]")  # fmt: skip
@click.option("--kind", type=click.Choice(["bias", "weights", "scores", "positional", "all"]), default="all",
              show_default=True,
              help="What the page can show: the bias, the attention weights, the scores (softmax input) or a "
              "summary's positional logits P (docs/positional.md); 'all': every one the file holds.")  # fmt: skip
@click.option("--layer", type=int, default=None,
              help="One layer (-1: the last stored).  [default: every layer the file holds]")  # fmt: skip
@click.option("--max-mb", type=click.FloatRange(min=0.5), default=None,
              help="Size budget of the page in MB.  [default: 14 up to 1024 positions, 38 beyond]")  # fmt: skip
@click.option("--tokenizer", type=click.Path(path_type=Path), default=None,
              help="tokenizer.json for the token read-out.  [default: the one the file names]")  # fmt: skip
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
def explore(files: tuple[Path, ...], out: Path | None, kind: str, layer: int | None, max_mb: float | None,
            tokenizer: Path | None, force: bool) -> None:  # fmt: skip
    """Write one HTML page to explore FILE.h5 (or compare FILE.h5 FILE2.h5: A, B and A - B).

    The page needs no network: hover a cell for its value, switch sample, kind and layer, enlarge and
    zoom into a head, and see each head's distance profile.
    """
    from biasviz.common.errors import UsageError
    from biasviz.common.outputs import check_output_file
    from biasviz.explorer import explore as build

    if len(files) > 2:
        raise UsageError(f"explore takes one file, or two to compare; got {len(files)}")
    target = out or Path("figures") / f"{'_vs_'.join(p.stem for p in files)}_explore.html"
    check_output_file(target, with_config(*files, tokenizer), force)  # before reading anything, as extract does
    page = build(files[0], files[1] if len(files) > 1 else None, kind=kind, layer=layer, max_mb=max_mb,
                 tokenizer=tokenizer)  # fmt: skip
    written = page.save(target, force=force)
    click.echo(f"wrote {written} ({page.nbytes / 1e6:.1f} MB; {page.summary})")
