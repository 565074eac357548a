#!/bin/bash
# The accuracy and training figures on the GPU machine, from the repository root, one part a call (each
# ends well inside the device tool's 10 minutes):
#   PART=training: benchmarks/training.py (each setup's step measured on the GPU against a float64 step)
#     and benchmarks/trained_weights.py (the probe on the GPU, on weights trained on the CPU and kept in
#     $WEIGHTS by `trained_weights.py --weights DIR`, carried along) side by side, then
#     benchmarks/watch_overhead.py alone (the monitor's cost a step is timed);
#   PART=families: benchmarks/model_classes.py --device cuda (the model classes and further families,
#     per output against the GPU's own kernels).
# The packages that ship weights (facenet-pytorch, resemblyzer) are not on the GPU machine: carried as
# wheels they are measured too, else trained_weights.py skips them with a line.
# Results and logs go to $OUT (default /tmp/accuracy-gpu).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/accuracy-gpu}
WEIGHTS=${WEIGHTS:-.gpu/trained}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch; print(torch.__version__, torch.version.cuda)" >> "$OUT/gpu.txt" 2>&1
if [ "${PART:-training}" = training ]; then
  # accuracy runs side by side (neither is timed); the overhead run alone afterwards
  timeout 300 python3 benchmarks/training.py --device cuda --out "$OUT/training_cuda.json" > "$OUT/training.log" 2>&1 &
  timeout 300 python3 benchmarks/trained_weights.py --device cuda --weights "$WEIGHTS" \
      --out "$OUT/trained_weights_cuda.json" > "$OUT/trained_weights.log" 2>&1 &
  wait
  timeout 150 python3 benchmarks/watch_overhead.py --device cuda --out "$OUT/watch_overhead_cuda.json" \
      > "$OUT/watch_overhead.log" 2>&1
  tail -3 "$OUT/training.log" "$OUT/trained_weights.log" "$OUT/watch_overhead.log"
elif [ "$PART" = families ]; then
  timeout 540 python3 benchmarks/model_classes.py --device cuda --timeout 120 --out "$OUT/model_classes_cuda.json" \
      > "$OUT/model_classes.log" 2>&1
  python3 -c "import json, sys; s = json.load(open(sys.argv[1]))['summary']; print(s['pairs'], s['within_3x'])" \
      "$OUT/model_classes_cuda.json"
fi
