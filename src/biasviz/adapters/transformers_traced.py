"""A transformers directory with no adapter of its own, loaded as what it holds and traced (:mod:`.traced`).

The class comes from the config (:mod:`.loading`), weights missing for it are an error, and an encoder-decoder runs
whole, its decoder fed the ids shifted right behind the decoder start token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from biasviz.adapters.base import ModelAdapter
from biasviz.adapters.traced import TracedAdapter
from biasviz.common.devices import device_mapped
from biasviz.common.errors import BiasvizError


def load_transformers_sdpa(directory: Path, scheme: str | None = None) -> TracedAdapter:
    """A transformers checkpoint of an architecture with no adapter, loaded as what it holds and traced.

    The class is the one config.json names, else the auto classes (:func:`~biasviz.adapters.loading.model_classes`);
    weights missing for it are an error, never initialised at random. SDPA attention; eager where SDPA cannot express
    the model (attention-logit softcapping, as Gemma2's) or where transformers has no SDPA path for the architecture:
    the trace follows eager attention too. With a device map (:func:`~biasviz.adapters.device_map.current_placement`)
    the model is spread as it says, in its precision. An encoder-decoder runs whole, its decoder fed the ids shifted
    right behind the decoder start token (:func:`decoder_ids`).
    """
    from biasviz.adapters.files import model_type, parameters_sha256, tokenizer_in
    from biasviz.common.inputs import read_text
    from biasviz.common.jsondoc import loads

    kind = model_type(directory)
    config_json = read_text(directory / "config.json", "config.json")
    config = loads(config_json, str(directory / "config.json"))
    softcapped = isinstance(config, dict) and config.get("attn_logit_softcapping") is not None
    model, reason = _from_pretrained(directory, ("eager",) if softcapped else ("sdpa", "eager"))
    if model is None:
        raise BiasvizError(f"{directory} is a '{kind}' model, which has no biasviz adapter, and transformers cannot "
                           f"load it with SDPA or eager attention: {reason}")  # fmt: skip
    takes = getattr(model, "main_input_name", "input_ids")
    if takes != "input_ids":
        raise BiasvizError(f"{directory} is a '{kind}' model ({type(model).__name__}), which takes {takes}, not token "
                           "ids: biasviz extract runs models on text; trace it from Python with biasviz.trace(model) "
                           "and your own inputs")  # fmt: skip
    if not device_mapped(model):
        model = model.float()
    if getattr(model.config, "is_encoder_decoder", False):
        start = decoder_start(model.config, directory)

        def forward(ids: torch.Tensor) -> Any:
            return model(input_ids=ids, decoder_input_ids=decoder_ids(ids, start), use_cache=False)
    else:

        def forward(ids: torch.Tensor) -> Any:
            return model(input_ids=ids, use_cache=False)

    return TracedAdapter(model.eval(), forward=forward, scheme=scheme, source=str(directory.resolve()),
                         sha256=parameters_sha256(directory), tokenizer=tokenizer_in(directory),
                         config_json=config_json, name=traced_name(kind, directory))  # fmt: skip


def traced_name(kind: str, directory: Path) -> str:
    """The name a traced directory's file and figures carry when no ``--scheme`` names it: its architecture
    (config.json's ``model_type``), else its directory's name, as one safe file-name component (text from a file is
    data: never a path separator, never a leading dot), so that two models written to one folder keep apart.

    >>> traced_name("llama", Path("/m/x")), traced_name("../..", Path("/m/my model")), traced_name("", Path("/m/.q"))
    ('llama', 'my_model', 'q')
    """
    from biasviz.common.outputs import file_stem

    for text in (kind, directory.resolve().name):
        stem = file_stem(text).strip("._") if text else ""
        if stem and stem != "unnamed":
            return stem
    return "traced"


def decoder_start(config: Any, directory: Path) -> int:
    """The token an encoder-decoder's decoder starts from: ``decoder_start_token_id``, else the pad token (T5's)."""
    for name in ("decoder_start_token_id", "pad_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise BiasvizError(f"{directory / 'config.json'} names no decoder_start_token_id (nor pad_token_id): the decoder "
                       "of an encoder-decoder model needs one to start from")  # fmt: skip


def decoder_ids(ids: torch.Tensor, start: int) -> torch.Tensor:
    """The decoder's input when the text is its own target (teacher forcing, as in training and as BART's forward
    builds it when given none): ``start`` followed by ids[:-1], so decoder query i predicts token i."""
    return torch.cat([torch.full_like(ids[:, :1], start), ids[:, :-1]], dim=1)


def _from_pretrained(directory: Path, implementations: tuple[str, ...]) -> tuple[nn.Module | None, str]:
    """The model of the first class (:func:`~biasviz.adapters.loading.model_classes`) and attention implementation
    that load it with every weight in place, or None and why none did; weights that fit no class are an error."""
    from biasviz.adapters.device_map import current_placement, load_placed
    from biasviz.adapters.loading import WeightsMismatch, load_checked, model_classes

    placement = current_placement()
    reason = ""
    mismatch: WeightsMismatch | None = None
    for auto in model_classes(directory):
        for impl in implementations:
            try:
                if placement is not None:
                    return load_placed(auto, directory, placement, attn_implementation=impl), ""
                return load_checked(auto, directory, attn_implementation=impl), ""
            except WeightsMismatch as exc:
                mismatch = exc  # the next class may fit them (a head the weights lack)
                break
            except (ValueError, KeyError, OSError, TypeError) as exc:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if mismatch is not None:
        raise mismatch
    return None, reason


class TransformersSdpaAdapter(TracedAdapter):
    """Any other transformers architecture (Llama, Qwen, BERT, ...): SDPA (or eager) attention, traced. Asked last."""

    placeable = True  # loads with a device map (extract --device-map)

    @classmethod
    def can_open(cls, path: Path) -> bool:
        return path.is_dir() and (path / "config.json").is_file()

    @classmethod
    def open(cls, path: Path, scheme: str | None = None, **options: Any) -> ModelAdapter:
        return load_transformers_sdpa(path, scheme)
