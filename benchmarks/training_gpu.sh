#!/bin/bash
# The training and trained-weights figures on the GPU machine, from the repository root, in one run:
# benchmarks/training.py (each setup's step measured on the GPU against a float64 step),
# benchmarks/watch_overhead.py (the monitor's cost a step), benchmarks/trained_weights.py (the probe on the
# GPU, on weights trained on the CPU and kept in $WEIGHTS by `trained_weights.py --weights DIR`).
# Results and logs go to $OUT (default /tmp/training-gpu).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/training-gpu}
WEIGHTS=${WEIGHTS:-.gpu/trained}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch; print(torch.__version__, torch.version.cuda)" >> "$OUT/gpu.txt" 2>&1
# Accuracy runs side by side (neither is timed); the overhead run alone afterwards.
timeout 300 python3 benchmarks/training.py --device cuda --out "$OUT/training_cuda.json" > "$OUT/training.log" 2>&1 &
timeout 300 python3 benchmarks/trained_weights.py --device cuda --weights "$WEIGHTS" \
    --out "$OUT/trained_weights_cuda.json" > "$OUT/trained_weights.log" 2>&1 &
wait
timeout 150 python3 benchmarks/watch_overhead.py --device cuda --out "$OUT/watch_overhead_cuda.json" \
    > "$OUT/watch_overhead.log" 2>&1
tail -3 "$OUT/training.log" "$OUT/trained_weights.log" "$OUT/watch_overhead.log"
