#!/usr/bin/env bash
# BENCHMARKS section 4 in one call: every GPU table, written as files, from a bare GPU machine in under 8 minutes.
#
#   bash bench/gpu_session.sh [OUT] [bench/gpu_run.py options]   # on the GPU machine (OUT: $OUT, else gpu-tables/)
#   bash bench/gpu_session.sh /tmp/rehearsal --dry-run            # the same parts at tiny sizes, on any CPU
#
# OUT receives gpu_tables.md (the tables), gpu_results.json (every row) and gpu_run.log (each part's output).
# Nothing must be installed: the machine's own torch, transformers, accelerate, h5py and pytest run biasviz from
# src/ (an editable install is tried first, quietly, so that files record biasviz's version; it may fail there).
# Wheels carried in .whl/ (isal, for the faster deflate; optional) are unpacked first where there are any.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out="${1:-${OUT:-gpu-tables}}"
[ $# -gt 0 ] && shift
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" || echo "the carried wheels did not install"
fi
[ -n "${OUT:-}" ] && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
# each part has its own limit (gpu_run.py); this one bounds the whole, tables written after every part survive it
exec timeout 480 "$python" bench/gpu_run.py --out "$out" "$@"
