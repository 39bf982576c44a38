"""``biasviz train``: train a GPT-2 variant offline and write a checkpoint directory."""

from __future__ import annotations

import json
from pathlib import Path

import click

from biasviz.cli.options import NonEmptyPath, checked, config_option, device_option, seed_option, with_config
from biasviz.common.checks import check_learning_rate
from biasviz.common.errors import UsageError
from biasviz.common.jsondoc import loads


@click.command()
@config_option
@click.option("--scheme", required=True, help="Positional scheme (see 'biasviz schemes').")
@click.option("--preset", default="tiny", show_default=True, type=click.Choice(["tiny", "gpt2-small"]))
@click.option("--steps", default=300, show_default=True, type=click.IntRange(min=1))
@click.option("--seq-len", default=128, show_default=True, type=click.IntRange(min=2), help="Training length T.")
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--lr", default=2e-3, show_default=True, type=float, callback=checked(check_learning_rate),
              help="Peak learning rate (AdamW, cosine).")  # fmt: skip
@click.option("--corpus", default=None, help="Text file or directory of text files [default: Python's stdlib].")
@click.option("--tokenizer", default=None, help="tokenizer.json to use instead of building one from the corpus.")
@click.option(
    "--scheme-options", default=None,
    help="JSON object of scheme options, e.g. '{\"slopes\": \"interleaved\"}' for ALiBi.",
)  # fmt: skip
@seed_option
@device_option
@click.option(
    "--precision", default="auto", show_default=True, type=click.Choice(["auto", "float32", "bfloat16"]),
    help="auto: bfloat16 autocast on CUDA, float32 on the CPU. Weights and checkpoints stay float32.",
)  # fmt: skip
@click.option("--compile", "compile_model", is_flag=True, help="torch.compile the model (faster steps on a GPU).")
@click.option(
    "--save-every", default=0, show_default=True, type=click.IntRange(min=0),
    help="Also write OUT/checkpoint-STEP/ at step 0 (the initialisation), every K steps and at the last, each "
    "loadable by --model: "
    "for 'biasviz extract --checkpoints'. 0: only the final checkpoint.",
)  # fmt: skip
@click.option("--out", required=True, type=NonEmptyPath(file_okay=False), help="Checkpoint directory to write.")
@click.option("--force", is_flag=True, help="Replace an existing biasviz checkpoint (never another folder).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(
    scheme: str, preset: str, steps: int, seq_len: int, batch_size: int, lr: float, corpus: str | None,
    tokenizer: str | None, scheme_options: str | dict | None, seed: int, device: str, precision: str,
    compile_model: bool, save_every: int, out: str, force: bool, quiet: bool,
) -> None:  # fmt: skip
    """Train a GPT-2 variant with the given positional scheme (offline, reproducible).

    Under torchrun each process takes its part of every batch (DistributedDataParallel); the batch is
    --batch-size per process, and process 0 writes the checkpoint.
    """
    from biasviz.common.settings import attention_mode
    from biasviz.schemes import canonical_name
    from biasviz.training.loop import TrainSettings
    from biasviz.training.loop import train as run_training

    attention_mode()  # checked before any work

    if isinstance(scheme_options, str):
        try:
            scheme_options = loads(scheme_options, "--scheme-options")
        except json.JSONDecodeError as exc:
            raise UsageError(f"--scheme-options is not valid JSON: {exc.msg}") from None
    if scheme_options is not None and not isinstance(scheme_options, dict):
        raise UsageError("--scheme-options must be a JSON object, e.g. '{\"slopes\": \"interleaved\"}'")
    settings = TrainSettings(
        scheme=canonical_name(scheme), preset=preset, steps=steps, seq_len=seq_len, batch_size=batch_size, lr=lr,
        seed=seed, corpus=corpus, tokenizer=tokenizer, scheme_options=dict(scheme_options or {}), device=device,
        precision=precision, compile=compile_model, save_every=save_every,
    )  # fmt: skip
    from biasviz.common.outputs import check_inputs_kept
    from biasviz.common.processes import process_group

    if Path(out).exists():  # --force replaces a checkpoint folder: never one holding the inputs
        check_inputs_kept(Path(out), with_config(corpus, tokenizer))

    with process_group(device) as (w, _):  # under torchrun: DistributedDataParallel over the processes
        result = run_training(settings, Path(out), force=force, progress=not quiet)
    if not w.main:
        return
    tokens_per_s = result.tokens / max(result.seconds, 1e-9)
    tail = result.losses[-10:]
    click.echo(
        f"trained {settings.scheme} ({preset}) for {steps} steps in {result.seconds:.1f} s "
        f"({tokens_per_s:,.0f} tokens/s); loss {result.losses[0]:.2f} -> {sum(tail) / len(tail):.2f}; "
        f"wrote {result.out_dir}"
    )
