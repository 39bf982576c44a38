"""Loading a transformers directory as what it holds, and refusing one whose weights do not fit its config.

A model run from weights transformers initialised at random gives figures of nothing, with no sign of it, so
every transformers load in biasviz goes through :func:`load_checked`: the weight files are read only as plain
tensors (safetensors, or a pickle of tensors read with ``weights_only``), and a load that leaves weights missing,
of another shape, or labelled with a type their parameter cannot hold stops with one error naming them.
:func:`model_classes` picks the class from the config: the architecture it names when transformers knows it for
that model type (never remote code), else the auto classes in order (an encoder-decoder as one).
"""

from __future__ import annotations

import contextlib
import json
import pickle
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from biasviz.adapters.files import check_config_sizes, check_safetensors, unsafe_pickle_error
from biasviz.common.errors import BiasvizError
from biasviz.common.inputs import read_text
from biasviz.common.jsondoc import loads
from biasviz.common.names import utf8_path

SHOWN = 5  # names an error lists before it counts the rest
_INTEGER_LABELS = {"BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64"}


class WeightsMismatch(BiasvizError, ValueError):
    """The weights of a directory do not fit the class it was loaded as (another class may still fit them); a
    ValueError too, for Python callers that catch bad values."""


def _named(keys: Iterable[str]) -> str:
    """The first few names and how many there are: ``a, b, c (and 12 more)``."""
    names = sorted(str(k) for k in keys)
    more = f" (and {len(names) - SHOWN} more)" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def check_weight_files(directory: Path) -> None:
    """Refuse safetensors files whose header lies (overlapping offsets, a dtype or shape that does not fit the bytes,
    an unknown dtype) before transformers reads them; the library's own message would be a traceback."""
    from safetensors import SafetensorError, safe_open

    for file in sorted(Path(directory).glob("*.safetensors")):
        check_safetensors(file)
        try:
            with safe_open(utf8_path(file), framework="pt") as f:
                f.keys()
        except (SafetensorError, OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BiasvizError(f"{file} is not a valid safetensors file ({first}); save the model again") from None


def _integer_labelled(directory: Path) -> dict[str, str]:
    """Tensors the safetensors headers label with an integer (or bool) dtype, by name."""
    found: dict[str, str] = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        with file.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        found.update({k: v["dtype"] for k, v in tensors.items() if v["dtype"] in _INTEGER_LABELS})
    return found


def _check_labels(model: Any, directory: Path) -> None:
    """A floating-point parameter read from a tensor labelled as integers holds the integers' values, not the
    trained weights: the file's dtype label lies."""
    labelled = _integer_labelled(directory)
    if not labelled or getattr(model, "hf_quantizer", None) is not None:  # quantized weights are integers on purpose
        return
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    floats = {name for name, p in model.state_dict().items() if p.is_floating_point()}
    bad = [k for k in labelled if {k, k.removeprefix(prefix), prefix + k} & floats]
    if bad:
        raise BiasvizError(f"the weights in {directory} label floating-point parameters as integers "
                           f"({_named(f'{k}: {labelled[k]}' for k in bad)}); the file's dtype labels are wrong: "
                           "save the model again")  # fmt: skip


def _without_a_place(unexpected: Iterable[str], model: Any) -> list[str]:
    """The unexpected weights that name a part of the model's own body (``h.1.attn...`` of a GPT-2 whose config has
    one layer): weights of the checkpoint the config leaves out. A head the loaded class has no use for (``lm_head``,
    ``cls``, ``pooler`` of a base model) is not its body."""
    base = getattr(model, "base_model", model)
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    body = {name for name, _ in base.named_children()}
    return [key for key in unexpected if key.removeprefix(prefix).split(".")[0] in body]


def check_loading_info(info: dict[str, Any], directory: Path, model_class: str, model: Any = None) -> None:
    """Stop where transformers reports weights missing (initialised at random), of another shape, or left out of
    the model's body; tied weights the library ties on purpose are not reported missing. Unexpected keys of a head
    the class does not use pass."""
    missing = set(info.get("missing_keys") or ())
    mismatched = [m[0] if isinstance(m, tuple) else m for m in info.get("mismatched_keys") or ()]
    if missing:
        raise WeightsMismatch(f"the weights in {directory} do not fit its config.json: loaded as {model_class}, "
                           f"{len(missing)} weights are missing and would be initialised at random: {_named(missing)}; "
                           "is config.json the one saved with these weights?")  # fmt: skip
    if mismatched:
        raise WeightsMismatch(f"the weights in {directory} do not fit its config.json: loaded as {model_class}, "
                           f"{len(mismatched)} weights have another shape: {_named(mismatched)}")  # fmt: skip
    conversions = info.get("conversion_errors") or {}
    unplaced = _without_a_place(info.get("unexpected_keys") or (), model) if model is not None else []
    if unplaced:
        raise WeightsMismatch(f"the weights in {directory} do not fit its config.json: loaded as {model_class}, "
                              f"{len(unplaced)} weights of the files have no place in the model and would be left "
                              f"out: {_named(unplaced)}; is config.json the one saved with these weights?")  # fmt: skip
    errors = [str(e) for e in info.get("error_msgs") or ()] + [f"{k}: {v}" for k, v in dict(conversions).items()]
    if errors:
        raise BiasvizError(f"cannot load the weights in {directory} as {model_class}: {errors[0].splitlines()[0]}")


def load_checked(model_class: Any, directory: Path, **kwargs: Any) -> Any:
    """``model_class.from_pretrained(directory, **kwargs)`` from local files, never remote code, with its loading
    report checked (:func:`check_loading_info`); a pickle that would run code, or weight files that lie, are one
    :class:`BiasvizError` each."""
    from safetensors import SafetensorError

    directory = Path(directory)
    check_weight_files(directory)
    check_config_sizes(directory)  # 0 heads is a ZeroDivisionError as transformers builds the model
    kwargs = {"local_files_only": True, "trust_remote_code": False, **kwargs, "output_loading_info": True}
    try:
        with _report_quiet():  # its loading report: what is wrong with the weights is checked, and said, below
            model, info = model_class.from_pretrained(utf8_path(directory), **kwargs)  # safetensors: UTF-8 paths
    except pickle.UnpicklingError as exc:  # transformers reads .bin files with weights_only: this one names code
        bins = sorted(directory.glob("*.bin"))
        raise unsafe_pickle_error(bins[0] if bins else directory, exc) from None
    except SafetensorError as exc:
        raise BiasvizError(f"the safetensors weights in {directory} cannot be read: {exc}") from None
    except RuntimeError as exc:  # a shape that does not fit, among others
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WeightsMismatch(f"cannot load the weights in {directory} as {_class_name(model_class)}: {first}") from exc
    check_loading_info(info, directory, type(model).__name__, model)
    _check_labels(model, directory)
    return model


def _class_name(model_class: Any) -> str:
    return str(getattr(model_class, "__name__", model_class))


@contextlib.contextmanager
def _report_quiet() -> Iterator[None]:
    """transformers' loading report (a table of missing and unexpected keys, as a warning, and the keys a weight
    mismatch leaves unsharded) left out in the block."""
    import logging

    logs = [logging.getLogger(f"transformers.{name}") for name in ("modeling_utils", "distributed.tensor_parallel")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)


def model_classes(directory: Path) -> list[Any]:
    """The classes to load ``directory`` with, most specific first.

    The architecture its config.json names (``architectures``), when transformers has that class for the config's
    model type: a directory is loaded as what was saved. Otherwise the auto classes: an encoder-decoder as one
    (``AutoModelForSeq2SeqLM``), else ``AutoModelForCausalLM``; then ``AutoModel``.
    """
    import transformers

    config = loads(read_text(Path(directory) / "config.json", "config.json"), str(Path(directory) / "config.json"))
    config = config if isinstance(config, dict) else {}
    named = config.get("architectures") or []
    classes: list[Any] = []
    for arch in named[:1] if isinstance(named, list) else []:
        cls = getattr(transformers, str(arch), None) if str(arch).isidentifier() else None
        known = isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
        if known and getattr(cls.config_class, "model_type", None) == config.get("model_type"):
            classes.append(cls)
    auto = transformers.AutoModelForSeq2SeqLM if config.get("is_encoder_decoder") else transformers.AutoModelForCausalLM
    return [*classes, auto, transformers.AutoModel]
