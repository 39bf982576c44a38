"""One extraction as asked for, by ``biasviz extract`` or ``biasviz.extract``: checked once, run by one dispatcher.

:class:`ExtractRequest` holds what to capture (a full file, a summary, the bias alone, a checkpoint sweep), where
(the output, the device or a device map, the storage type and compression), at what resolution and on how many
windows of what length. It is checked when made, with the messages of the command line, so the command and the
Python API refuse the same mistakes with the same words. :func:`run` then picks the one entry point that applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path
from typing import Any

from biasviz.common.errors import BiasvizError, UsageError
from biasviz.store.compression import Compression, parse_compression

DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class ExtractRequest:
    """What ``biasviz extract`` (or ``biasviz.extract``) was asked to do; see docs/cli.md for each field's option."""

    model: Any  # a path, ORG/NAME, CODE.py:FACTORY, or (from Python) a torch.nn.Module or an adapter
    out: str | Path | None = None
    layers: int | str | list[int] = -1
    checkpoint: str | None = None  # CODE.py:FACTORY's argument
    scheme: str | None = None
    samples: int | None = None
    seq_len: int | None = None
    batch_size: int = 1
    seed: int | None = None
    text: str | None = None
    tokenizer: str | None = None
    summary: bool = False
    bias_only: bool = False
    capture: str | Sequence[str] | None = None  # None: bias and weights
    checkpoints: str | None = None
    step_pattern: str | None = None
    resume: bool = False
    resolution: int | None = None
    device: Any = "auto"
    device_map: Any = None
    max_memory: Any = None
    offload_folder: Any = None
    dtype: str = "float32"
    model_dtype: Any = None  # None: the model's own
    force: bool = False
    compression: Any = None  # None: gzip level 1 (store.compression)
    no_scale: bool = False
    part: str | None = None
    forward: Any = None
    progress: bool | None = None
    kinds: list[str] | None = field(init=False, default=None)  # the capture, checked (None: the default)
    codec: Compression = field(init=False, default=Compression("gzip", 1))  # the compression, checked

    def __post_init__(self) -> None:
        self._check_what()
        self._check_where()
        object.__setattr__(self, "codec", parse_compression(self.compression))
        if self.compression is not None and self.summarised:
            raise UsageError(f"--compression applies to full files; {self._mode} stores its maps with gzip")

    @property
    def summarised(self) -> bool:
        """Whether the file is a summary (``--summary``, or ``--bias-only --resolution R``)."""
        return self.summary or (self.bias_only and self.resolution is not None)

    @property
    def _mode(self) -> str:
        return "--summary" if self.summary else "--bias-only"

    def _check_what(self) -> None:
        """What to capture: the options of each kind of file, refused where they cannot apply."""
        if self.resolution is not None and not (self.summary or self.bias_only):
            raise UsageError("--resolution applies with --summary or --bias-only")
        if self.summary and self.bias_only:
            raise UsageError("--bias-only with --resolution already writes a summary; drop --summary")
        if self.resolution is not None and self.seq_len is not None:
            from biasviz.extraction.summary import resolve_resolution

            resolve_resolution(self.resolution, self.seq_len)
        object.__setattr__(self, "kinds", self._capture_kinds())
        if self.bias_only:
            named = [f"--{k.replace('_', '-')}" for k in ("text", "tokenizer", "no_scale") if getattr(self, k)]
            if self.forward is not None:
                named.append("forward=")
            if named:
                raise UsageError(f"{', '.join(named)} cannot apply with --bias-only, which reads no text and computes "
                                 "no attention weights; drop one or the other")  # fmt: skip
        for given, flag in ((self.step_pattern, "--step-pattern"), (self.resume, "--resume")):
            if given and not self.checkpoints:
                raise UsageError(f"{flag} applies with --checkpoints")
        if self.checkpoints and (self.bias_only or self.checkpoint):
            raise UsageError(f"--checkpoints cannot apply with {'--bias-only' if self.bias_only else '--checkpoint'}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, Integral) or self.batch_size < 1:
            raise BiasvizError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.dtype not in DTYPES:
            raise BiasvizError(f"unsupported storage dtype '{self.dtype}'; use float32 or float16")

    def _capture_kinds(self) -> list[str] | None:
        """--capture as the kinds a full file stores (None: the default), refused where it cannot apply."""
        if self.capture is None:
            return None
        from biasviz.extraction.run import parse_capture

        kinds = parse_capture(self.capture)
        if self.summary or self.bias_only:
            stores = "the maps of bias, weights and scores" if self.summary else "the bias alone"
            raise UsageError(f"--capture applies to full files; {self._mode} stores {stores}")
        if self.checkpoints and "scores" in kinds:
            raise UsageError("--capture scores cannot apply with --checkpoints yet; extract each checkpoint with "
                             "--model")  # fmt: skip
        return kinds

    def _check_where(self) -> None:
        """The model's code and placement: a device map, a factory's checkpoint, --no-scale and --part."""
        factory = self._is_factory()
        given = isinstance(self.model, (str, Path))
        if self.forward is not None and given:
            raise BiasvizError("forward= applies to a torch.nn.Module given directly")
        if factory or not given:  # the user's code builds the model, or the user built it
            for value, flag in ((self.no_scale, "--no-scale"), (self.part, "--part")):
                if value:
                    raise UsageError(f"{flag} does not apply to --model CODE.py:FACTORY (your code builds the model)")
        elif self.checkpoint is not None:
            raise UsageError("--checkpoint applies to --model CODE.py:FACTORY only; give a checkpoint as --model")
        if self.bias_only and self._processes() > 1:
            raise UsageError("--bias-only runs in one process; start it without torchrun")
        if self.device_map is None:
            return
        if self._processes() > 1:  # refused before the processes wait for each other
            raise UsageError("--device-map runs in one process (the map spreads one model over this machine's "
                             "devices); start it without torchrun")  # fmt: skip
        if str(self.device).strip().lower() != "auto":
            raise UsageError(f"--device {self.device} does not apply with --device-map: the map places every module "
                             "(inputs go where the first layer runs); use --max-memory to choose the devices")
        if self.bias_only or self.checkpoint:
            raise UsageError(f"--device-map cannot apply with {'--bias-only' if self.bias_only else '--checkpoint'}: "
                             "it loads a transformers model directory to run it")  # fmt: skip
        if factory or not given:
            raise UsageError("--device-map applies to a transformers model directory; a model your code builds "
                             "(CODE.py:FACTORY) or you built or loaded yourself (with from_pretrained(device_map=...), "
                             "say) is run where it is")  # fmt: skip

    def _is_factory(self) -> bool:
        from biasviz.adapters.factory import is_factory_spec

        return isinstance(self.model, (str, Path)) and is_factory_spec(self.model)

    @staticmethod
    def _processes() -> int:
        from biasviz.common.processes import world

        return world().size

    def placement(self) -> Any:
        """The checked --device-map, --max-memory and --offload-folder (None without a map), before anything loads."""
        from biasviz.adapters.device_map import placement_from

        return placement_from(self.device_map, self.max_memory, self.offload_folder, self.model_dtype)

    def model_options(self, placement: Any = None) -> dict[str, Any]:
        """What :func:`biasviz.adapters.load_model` takes besides the path and scheme."""
        return {k: v for k, v in (("attn_scale", 1.0 if self.no_scale else None), ("part", self.part),
                                  ("placement", placement)) if v is not None}  # fmt: skip

    def options(self) -> dict[str, Any]:
        """The keyword arguments every entry point of a run with windows takes (layers, device and target aside)."""
        got: dict[str, Any] = {"dtype": self.dtype, "batch_size": self.batch_size, "model_dtype": self.model_dtype,
                               "force": self.force, "seed": self.seed, "progress": self.progress}  # fmt: skip
        if self.summary:
            got["resolution"] = self.resolution
            return got
        if self.kinds is not None:
            got["capture"] = self.kinds
        if self.compression is not None:
            got["compression"] = self.codec.label
        return got


def run(request: ExtractRequest, adapter: Any, windows: Any, out: Path, *, layers: Any, device: Any,
        w: Any = None, series: Any = None, placement: Any = None, **extra: Any) -> Any:  # fmt: skip
    """Run ``request`` on ``adapter`` (loaded where it runs) through the one entry point that applies; ``windows`` are
    the token windows (None for ``--bias-only``), ``w`` the torchrun world, ``series`` the resolved checkpoints.
    ``extra`` goes to the entry point (``attrs``, ``text_source``, a summary's own options). Returns its result."""
    size = 1 if w is None else w.size
    if request.bias_only:
        return _bias_only(request, adapter, out, layers=layers, device=device)
    run_options = {**request.options(), "layers": layers, "device": device, **extra}
    if request.checkpoints:
        from biasviz.extraction.sweep import extract_sweep

        return extract_sweep(request.model, request.checkpoints, windows, out, scheme=request.scheme,
                             summary=request.summary, resume=request.resume, series=series, w=w,
                             model_options=request.model_options(placement),
                             first=adapter if w is None or w.main else None, **run_options)  # fmt: skip
    if request.summary and size > 1:
        from biasviz.extraction.distributed import summarise_parallel

        return summarise_parallel(adapter, windows, out, w=w, **run_options)
    if request.summary:
        from biasviz.extraction.summary import extract_summary

        return extract_summary(adapter, windows, out, **run_options)
    if size > 1:
        from biasviz.extraction.distributed import extract_parallel

        return extract_parallel(adapter, windows, out, w=w, **run_options)
    from biasviz.extraction.run import extract

    return extract(adapter, windows, out, **run_options)


def _bias_only(request: ExtractRequest, adapter: Any, out: Path, *, layers: Any, device: Any) -> Any:
    """``--bias-only``: the bias from the scheme's formula over ``seq_len`` positions, full or summarised."""
    from biasviz.extraction.bias_only import bias_only_summary, extract_bias_only

    common = {"layers": layers, "device": device, "model_dtype": request.model_dtype, "force": request.force}
    assert request.seq_len is not None
    if request.resolution is not None:
        return bias_only_summary(adapter, request.seq_len, out, resolution=request.resolution, **common)
    return extract_bias_only(adapter, request.seq_len, out, dtype=request.dtype, compression=request.codec, **common)
