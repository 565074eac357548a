#!/bin/bash
# `preclint plan` on the GPU machine (benchmarks/README.md, "Plan"), from the repository root: the
# plan tests with verification on cuda, and the throughput all-low / with the plan / all-float32.
# Results go to $OUT (default /tmp/plan-gpu).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/plan-gpu}
mkdir -p "$OUT"
timeout 60 python3 -m preclint plan tests/models/plan_culprits.py --model WideLayer --input 8x64 --precision fp16 \
    --rtol 1e-2 --atol 1e-3 --device cuda --output-format json > "$OUT/widelayer_fp16_cuda.json" 2> "$OUT/widelayer.err"
timeout 60 python3 -m preclint plan tests/models/plan_culprits.py --model OffsetClassifier --input 256x32 \
    --precision fp16 --max-flip 0.01 --device cuda --output-format json > "$OUT/offset_fp16_cuda.json" 2> "$OUT/offset.err"
timeout 420 python3 benchmarks/plan_throughput.py --models "${MODELS:-resnet50,vit_b_16,fasterrcnn_resnet50_fpn,llama_1b}" \
    --precision "${PRECISION:-fp16}" --out "$OUT/plan_throughput_h200.json" > "$OUT/throughput.log" 2>&1
tail -3 "$OUT/throughput.log"
python3 - "$OUT/plan_throughput_h200.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["model"], "float32 %.1f/s all-low %.1f/s" % (r.get("float32_per_s", 0), r.get("all_low_per_s", 0)), r.get("error", ""))
    for p in r["plans"]:
        print("   atol_rel", p["atol_rel"], "kept", p.get("kept_flops_fraction"), "meets", p.get("meets"),
              "plan %.1f/s (x%.2f of all-low)" % (p.get("plan_per_s", 0), p.get("plan_vs_all_low", 0)), p.get("error", ""))
PY
