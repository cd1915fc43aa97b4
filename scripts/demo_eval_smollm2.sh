#!/usr/bin/env bash
# The real run of docs/evaluate.md: SmolLM2-135M dense vs two extracted Pareto points (90% and 80% of
# the params, first-channel and magnitude selection), zero-shot on the offline commonsense sets, plus BIG-bench SIQA when it has been prepared
# (scripts/prepare_bigbench_siqa.py). CPU is fine: about 4 minutes for the offline sets on 2 cores.
# Usage: bash scripts/demo_eval_smollm2.sh [OUT_DIR]   (default out/demo-eval)
set -euo pipefail
OUT=${1:-out/demo-eval}
PY=${PYTHON:-python}
BASE=$($PY -c "from nsc_prune.gguf import smollm2_checkpoint; print(smollm2_checkpoint())")
mkdir -p "$OUT"
ln -sfn "$BASE" "$OUT/smollm2-135m"   # the label in the table is the folder name
$PY -m nsc_prune --model smollm2-135m --budget 85% --out "$OUT/search" --no-plot
for b in 90 80; do  # first channels (the LoNAS convention) and largest-norm channels
  [ -d "$OUT/smollm2-p$b" ] || $PY -m nsc_prune extract --pareto "$OUT/search/pareto.json" --budget "$b%" \
      --base "$BASE" --selection first --out "$OUT/smollm2-p$b"
  [ -d "$OUT/smollm2-p$b-mag" ] || $PY -m nsc_prune extract --pareto "$OUT/search/pareto.json" --budget "$b%" \
      --base "$BASE" --selection magnitude --out "$OUT/smollm2-p$b-mag"
done
CKPTS=("$OUT/smollm2-135m" "$OUT/smollm2-p90" "$OUT/smollm2-p80" "$OUT/smollm2-p90-mag" "$OUT/smollm2-p80-mag")
time $PY -m nsc_prune eval "${CKPTS[@]}" --tasks commonsense8_offline --device cpu --out "$OUT/eval-offline" --overwrite
SIQA=$($PY -c "from nsc_prune.gguf import default_cache_dir; print(default_cache_dir() / 'bigbench-siqa')")
if [ -d "$SIQA" ]; then
  time $PY -m nsc_prune eval "${CKPTS[@]}" --tasks "$SIQA" --device cpu --out "$OUT/eval-siqa" --overwrite
fi
