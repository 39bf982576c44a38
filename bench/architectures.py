"""Every causal-LM architecture the installed transformers knows (or, ``--family``, every encoder-decoder or masked-LM
encoder), as a user's checkpoint would reach biasviz: a tiny randomly initialised model of each, saved locally,
extracted by ``biasviz.extract`` (a full file and a summary exact per cell), each attention call's weights compared
with transformers' own eager ``output_attentions`` of the layer whose module made it (the file's ``call_modules``).
Nothing is downloaded.

    .venv/bin/python bench/architectures.py                      # every causal model_type (about an hour on 2 cores)
    .venv/bin/python bench/architectures.py --only llama,xglm    # some
    .venv/bin/python bench/architectures.py --family seq2seq     # encoder-decoders (or: encoder)
    .venv/bin/python bench/architectures.py --dtype bfloat16     # each model run in bfloat16, as on a GPU

Prints one row per architecture: the calls and the modules that made them, the largest difference of the full
file's weights and of the summary's per-cell means from transformers' own, or why none was compared. A tiny config
that transformers itself cannot build or run ("not built") says nothing of biasviz. A model whose eager and SDPA
paths differ (a deep random model can) differs by as much in this comparison: ``--check-paths`` prints that gap.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

T, N = 48, 3
TINY = {  # what makes a config tiny, in each spelling transformers' configs use
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 512, "head_dim": 16, "n_embd": 64,
    "n_head": 4, "n_layer": 2, "n_positions": 512, "d_model": 64, "n_heads": 4, "n_layers": 2, "num_heads": 4,
    "num_layers": 2, "ffn_dim": 128, "n_inner": 128, "moe_intermediate_size": 32, "num_experts": 4,
    "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "rotary_dim": 8, "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8, "v_head_dim": 16, "kv_lora_rank": 16, "q_lora_rank": 32, "pad_token_id": 0,
    "bos_token_id": 1, "eos_token_id": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "num_encoder_layers": 2, "num_decoder_layers": 2,
    "sliding_window": 16, "attention_window_size": 16,  # (where a config has a window: one shorter than T)
}  # fmt: skip
# what an architecture needs beside TINY to be built small (None: leave the config's own value), and variants of one
# model_type that attend in another way (Falcon's ALiBi, its newer decoder), run as rows of their own
OWN: dict[str, tuple[str, dict]] = {
    "falcon": ("falcon", {"head_dim": None}),
    "falcon+alibi": ("falcon", {"head_dim": None, "alibi": True}),
    "falcon+new_decoder": ("falcon", {"head_dim": None, "new_decoder_architecture": True, "num_kv_heads": 2}),
    "gpt_neo": ("gpt_neo", {"attention_types": [[["global", "local"], 1]], "window_size": 16}),
    "jamba": ("jamba", {"attn_layer_offset": 1, "attn_layer_period": 2, "expert_layer_offset": 1,
                        "expert_layer_period": 2}),
    "bamba": ("bamba", {"attn_layer_indices": [1]}),
    "granitemoehybrid": ("granitemoehybrid", {"layer_types": ["linear_attention", "attention"]}),
    "recurrent_gemma": ("recurrent_gemma", {"block_types": ["recurrent", "attention"]}),
    "qwen4_exp_text": ("qwen4_exp_text", {"layer_types": ["linear_attention", "indexed_attention"]}),
    "prophetnet": ("prophetnet", {"num_hidden_layers": None}),
    "gemma3n_text": ("gemma3n_text", {"num_kv_shared_layers": 0}),
    "marian": ("marian", {"decoder_start_token_id": 0, "decoder_vocab_size": 256}),
    "t5gemma": ("t5gemma", {side: {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                                   "vocab_size": 256} for side in ("encoder", "decoder")}
                | {"vocab_size": 256, "pad_token_id": 0, "bos_token_id": 2, "decoder_start_token_id": 2}),
    "dbrx": ("dbrx", {"attn_config": {"kv_n_heads": 2, "rope_theta": 10000, "clip_qkv": 8},
                      "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}}),
    "zamba2": ("zamba2", {"layers_block_type": ["mamba", "hybrid"]}),
    "zamba": ("zamba", {"layers_block_type": ["mamba", "hybrid"], "attn_layer_period": 2, "attn_layer_offset": 1}),
    "reformer": ("reformer", {"is_decoder": True}),
}  # fmt: skip

ONE = r"""
import json, re, sys, warnings
import numpy as np, torch, h5py
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM
import biasviz
from biasviz.common.errors import BiasvizError
warnings.filterwarnings("ignore")
row_name, folder, tiny, T, N, check = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), *map(int, sys.argv[4:7])
name, own = json.loads(sys.argv[7])
seq2seq = sys.argv[8] == "seq2seq"
dtype = sys.argv[9]  # the dtype the model runs in, for the reference and for biasviz alike
run = {} if dtype == "float32" else {"model_dtype": dtype}
Auto = {"seq2seq": AutoModelForSeq2SeqLM, "encoder": AutoModelForMaskedLM}.get(sys.argv[8], AutoModelForCausalLM)
def inputs(ids, config):  # an encoder-decoder's decoder reads the window shifted right behind its start token
    if not seq2seq:
        return {"input_ids": torch.from_numpy(ids)}
    start = getattr(config, "decoder_start_token_id", None)
    start = config.pad_token_id if start is None else start
    shifted = np.concatenate([np.full((len(ids), 1), start), ids[:, :-1]], axis=1)
    return {"input_ids": torch.from_numpy(ids), "decoder_input_ids": torch.from_numpy(shifted)}
row = {"name": row_name}
try:
    base = AutoConfig.for_model(name)
    def has(key):  # a per-layer attribute (Gemma 4's head_dim) is one too, though reading it globally raises
        try:
            return hasattr(base, key)
        except Exception:
            return True
    kw = {k: v for k, v in tiny.items() if has(k)}
    if getattr(base, "kv_lora_rank", None):  # latent attention (DeepSeek's MLA): a key head a query head, rope dims
        kw.update(num_key_value_heads=tiny["num_attention_heads"], head_dim=tiny["qk_rope_head_dim"])
    kw.update({k: v for k, v in own.items() if v is not None})
    for k in [k for k, v in own.items() if v is None]:
        kw.pop(k, None)
    if getattr(base, "sliding_window", None) is None:
        kw.pop("sliding_window", None)
    types = [] if own else list(getattr(base, "layer_types", None) or [])  # a config set by hand: as it is
    tries = [kw]
    if types:  # a hybrid: its layers up to the first full attention, at most 4 (else as its config gives them)
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        keep = (types[: full[0] + 1] if full else types[:2])[-4:]
        tries.insert(0, {**kw, "layer_types": keep, "num_hidden_layers": len(keep)})
    for at, kwargs in enumerate(tries):  # the first that transformers builds and runs
        try:
            config = AutoConfig.for_model(name, **kwargs)
            torch.manual_seed(0)
            try:
                model = Auto.from_config(config, attn_implementation="sdpa")
            except ValueError:  # no SDPA path in transformers for it
                model = Auto.from_config(config, attn_implementation="eager")
            model.save_pretrained(f"{folder}/model")
            top = min(250, int(getattr(config, "vocab_size", 256) or 256))
            ids = np.random.default_rng(0).integers(3, top, size=(N, T))
            eager = Auto.from_pretrained(f"{folder}/model", attn_implementation="eager",
                                         dtype=getattr(torch, dtype)).eval()
            if name == "falcon" and config.alibi:  # its eager path adds ALiBi twice, its SDPA path (and RW's) once:
                def once(module, args, kwargs):  # the reference is the model as run, the mask's copy left out
                    mask = kwargs.get("attention_mask")
                    if mask is not None and mask.dtype != torch.bool:
                        kwargs["attention_mask"] = mask.masked_fill(mask >= -1, 0.0)
                    return args, kwargs
                for block in eager.transformer.h:
                    block.self_attention.register_forward_pre_hook(once, with_kwargs=True)
            with torch.no_grad():
                out = eager(**inputs(ids, config), output_attentions=True, output_hidden_states=bool(check),
                            use_cache=False)  # a hybrid's cache of its own may refuse an attention-only count
            break
        except Exception:
            if at == len(tries) - 1:
                raise
    if seq2seq:  # the calls in the order the model makes them: the encoder's, then each decoder layer's self and cross
        # (compared by the module that made each: a call the trace does not see is then missing, not misplaced)
        pairs = zip(out.decoder_attentions or (), out.cross_attentions or ())
        attentions = [*(out.encoder_attentions or ()), *(a for pair in pairs for a in pair)]
    else:
        attentions = out.attentions or ()
    if check:
        try:
            sdpa = Auto.from_pretrained(f"{folder}/model", attn_implementation="sdpa",
                                        dtype=getattr(torch, dtype)).eval()
            with torch.no_grad():
                got = sdpa(**inputs(ids, config), output_hidden_states=True, use_cache=False)
            def both(o):
                return o.encoder_hidden_states + o.decoder_hidden_states if seq2seq else o.hidden_states
            row["paths"] = max(float((a - b).abs().max()) for a, b in zip(both(out), both(got)))
        except ValueError:  # no SDPA path: biasviz runs it eager too
            row["paths"] = 0.0
except Exception as exc:
    print(json.dumps({**row, "not built": f"{type(exc).__name__}: {str(exc)[:160]}"}))
    raise SystemExit
try:
    try:
        biasviz.extract(f"{folder}/model", ids, f"{folder}/full.h5", layers="all", progress=False, **run)
    except BiasvizError as exc:  # a bias under a mask of the call's own (a window): the weights, as the error says
        if "masks cells of its own" not in str(exc):
            raise
        biasviz.extract(f"{folder}/model", ids, f"{folder}/full.h5", layers="all", progress=False, capture="weights",
                        **run)
        row["note"] = "full file: weights alone (a bias under the call's own mask)"
    biasviz.extract(f"{folder}/model", ids, f"{folder}/sum.h5", layers="all", summary=True, resolution=T,
                    progress=False, **run)
    causal = np.tril(np.ones((T, T), dtype=bool))
    full_gap = sum_gap = 0.0
    with h5py.File(f"{folder}/full.h5") as full, h5py.File(f"{folder}/sum.h5") as summary:
        recorded = json.loads(full.attrs.get("call_modules", "[]"))  # our adapters' files: a layer is a layer
        owners = recorded or [f"layers.{layer}." for layer in range(int(full.attrs["n_layers"]))]
        attending = [a for a in attentions if a is not None]
        # one weight per call, in order; else (DiffLlama's two calls a layer) the layer numbered in the call's module
        by_layer = len(attending) != len(owners) and len(attentions) == getattr(config, "num_hidden_layers", -1)
        row["calls"] = len(owners)
        row["modules"] = (sorted(set(owners))[:2] + (["..."] if len(set(owners)) > 2 else [])) if recorded else [
            "biasviz's adapter: its layers"]
        if len(attending) < len(set(owners)):  # transformers returns no weights for it (BigBird's, say)
            print(json.dumps({**row, "no reference": f"output_attentions gives {len(attending)} layers' weights for "
                                                     f"{len(owners)} calls"}))
            raise SystemExit
        for call, owner in enumerate(owners):
            at = re.search(r"\.(\d+)\.", f".{owner}.")
            if seq2seq and recorded:  # the call's own weights, by the module that made it (its stack, kind, layer)
                cross = any(w in owner for w in ("encoder_attn", "EncDecAttention", "cross_att", "crossattention"))
                stack = (out.cross_attentions if cross else out.decoder_attentions) if "decoder" in owner \
                    else out.encoder_attentions  # fmt: skip
                want = stack[int(at.group(1))].double().numpy()
            else:
                want = (attentions[int(at.group(1))] if at and by_layer else attending[call]).double().numpy()
            got = full[f"layer_{call}/weights"][...]
            if got.shape != want.shape:  # transformers' own weights of another layout (LED's local windows)
                print(json.dumps({**row, "no reference": f"output_attentions gives {want.shape[1:]} a sample for "
                                                         f"call {call}, the file {got.shape[1:]}"}))
                raise SystemExit
            full_gap = max(full_gap, float(np.abs(got - want).max()))
            mean = summary[f"layer_{call}/weights_mean"][...]
            # a cell no sample attends is NaN in the summary, and must be 0 in every sample's weights
            seen, unseen = ~np.isnan(mean) & causal, np.isnan(mean) & causal
            gaps = [np.abs(mean[seen] - want.mean(0)[seen]), np.abs(want.mean(0)[unseen])]
            sum_gap = max(sum_gap, *(float(g.max()) for g in gaps if g.size))
    row.update(full=full_gap, summary=sum_gap)
except BiasvizError as exc:  # refused with one clear line, as the CLI says it: no fault of biasviz's
    row["refused"] = str(exc)[:200]
except Exception as exc:
    row["failed"] = f"{type(exc).__name__}: {str(exc)[:200]}"
print(json.dumps(row))
"""


def names(family: str = "causal") -> list[str]:
    """Every model_type with a causal-LM class (or, ``seq2seq``, an encoder-decoder one) in the installed
    transformers."""
    from transformers.models.auto import modeling_auto

    if family == "seq2seq":
        return sorted(modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
    if family == "encoder":
        return sorted(modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    return sorted({*modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, *OWN})


def run_one(name: str, check: bool, limit: float, family: str = "causal", dtype: str = "float32") -> dict:
    """One architecture in a process of its own (a model that breaks the interpreter breaks only its row)."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            got = subprocess.run([sys.executable, "-c", ONE, name, folder, json.dumps(TINY), str(T), str(N),
                                  str(int(check)), json.dumps(OWN.get(name, (name, {}))), family, dtype],
                                 capture_output=True, text=True, timeout=limit)  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"name": name, "failed": f"more than {limit:g} s"}
    lines = [line for line in got.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"name": name, "failed": f"exit {got.returncode}: {got.stderr.strip().splitlines()[-1:]}"}
    return json.loads(lines[-1])


def row_text(row: dict) -> str:
    """One markdown row: the architecture, its calls, the two differences or why there are none."""
    if "not built" in row:
        return f"| {row['name']} | | | | not built: {row['not built'][:90]} |"
    if "refused" in row:
        return f"| {row['name']} | | | | refused: {row['refused'][:120]} |"
    if "no reference" in row:
        return f"| {row['name']} | | | | no reference: {row['no reference']} |"
    if "failed" in row:
        return f"| {row['name']} | | | | **failed**: {row['failed'][:120]} |"
    notes = ([f"eager vs SDPA {row['paths']:.1e}"] if "paths" in row else []) + ([row["note"]] if "note" in row else [])
    paths = "; ".join(notes)
    modules = ", ".join(row.get("modules", []))
    return f"| {row['name']} | {row['calls']} ({modules}) | {row['full']:.1e} | {row['summary']:.1e} | {paths} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated model_types (default: every one of --family)")
    parser.add_argument("--family", choices=("causal", "seq2seq", "encoder"), default="causal",
                        help="causal LMs; encoder-decoders (every call of the encoder and the decoder, each compared "
                        "by the module that made it; T5's own adapter: the encoder's); or masked-LM encoders, whose "
                        "calls see every key")  # fmt: skip
    parser.add_argument("--check-paths", action="store_true", help="also the gap between eager and SDPA's hidden "
                        "states (transformers' own), which the differences include")  # fmt: skip
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="the dtype each model runs in (the reference's too): a lower precision compares to its "
                        "own rounding")  # fmt: skip
    parser.add_argument("--limit", type=float, default=300.0, help="seconds per architecture")
    parser.add_argument("--json", type=Path, help="also write every row to this file")
    args = parser.parse_args()
    chosen = args.only.split(",") if args.only else names(args.family)
    print(f"{len(chosen)} architectures, T = {T}, N = {N}, {args.dtype}; max |weights - output_attentions| (full file) "
          "and max |weights_mean - their mean| (summary, every causal cell)\n")
    print("| model_type | calls (modules) | full | summary | note |\n| --- | --- | --- | --- | --- |")
    rows = []
    for name in chosen:
        rows.append(run_one(name, args.check_paths, args.limit, args.family, args.dtype))
        print(row_text(rows[-1]), flush=True)
    compared = [r for r in rows if "full" in r]
    print(f"\n{len(compared)} compared, {sum('refused' in r for r in rows)} refused, "
          f"{sum('failed' in r for r in rows)} failed, "
          f"{sum('not built' in r for r in rows)} not built by transformers from the tiny config")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
