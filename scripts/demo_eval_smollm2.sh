#!/usr/bin/env bash
# The real run of docs/evaluate.md: SmolLM2-135M dense vs two extracted Pareto points (90% and 80% of
# the params on ffn-grid, layer 0 protected), each with first-channel and activation selection,
# zero-shot on the offline commonsense sets, plus BIG-bench SIQA when it has been prepared
# (scripts/prepare_bigbench_siqa.py). CPU is fine: about 5 minutes for the offline sets on 2 cores,
# about 6 minutes per checkpoint for SIQA.
# Usage: bash scripts/demo_eval_smollm2.sh [OUT_DIR]   (default out/demo-eval)
set -euo pipefail
OUT=${1:-out/demo-eval}
PY=${PYTHON:-python}
BASE=$($PY -m nsc_prune models --prepare smollm2-135m)
mkdir -p "$OUT"
ln -sfn "$BASE" "$OUT/smollm2-135m"   # the label in the table is the folder name
# Calibration text for --selection activation: Python's own language-reference topics (ships with Python).
$PY -c "from pydoc_data.topics import topics; print('\n\n'.join(topics[k] for k in sorted(topics)))" > "$OUT/calib.txt"
$PY -m nsc_prune --model smollm2-135m --space ffn-grid --set ffn_step=64 --set 'protect_layers=[0]' \
    --budget 85% --out "$OUT/search" --no-plot --overwrite
for b in 90 80; do  # the same plan, two channel selections
  [ -d "$OUT/smollm2-p$b-first" ] || $PY -m nsc_prune extract --pareto "$OUT/search/pareto.json" --budget "$b%" \
      --base "$BASE" --selection first --out "$OUT/smollm2-p$b-first"
  [ -d "$OUT/smollm2-p$b-act" ] || $PY -m nsc_prune extract --pareto "$OUT/search/pareto.json" --budget "$b%" \
      --base "$BASE" --selection activation --calib "$OUT/calib.txt" --out "$OUT/smollm2-p$b-act"
done
CKPTS=("$OUT/smollm2-135m" "$OUT/smollm2-p90-first" "$OUT/smollm2-p80-first" "$OUT/smollm2-p90-act" "$OUT/smollm2-p80-act")
time $PY -m nsc_prune eval "${CKPTS[@]}" --tasks commonsense8_offline --device cpu --out "$OUT/eval-offline" --overwrite
SIQA=$($PY -c "from nsc_prune._files import cache_dir; print(cache_dir('bigbench-siqa'))")
if [ -d "$SIQA" ]; then
  time $PY -m nsc_prune eval "${CKPTS[@]}" --tasks "$SIQA" --device cpu --out "$OUT/eval-siqa" --overwrite
fi
