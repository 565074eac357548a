#!/bin/bash
# The probe's GPU figures (benchmarks/README.md, "Probe"), in one run on the GPU machine, from the
# repository root: the GPU tests, the speed of resnet50 at batch 32, emulation against the GPU.
# Results go to $OUT (default /tmp/probe-gpu).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/probe-gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" >> "$OUT/gpu.txt"
timeout 180 python3 benchmarks/probe.py speed --device cuda --model resnet50 --batch 32 --ablate \
    --out "$OUT/speed_resnet50_b32.json" > "$OUT/speed.log" 2>&1
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/probe/test_probe_gpu.py tests/probe/test_probe.py > "$OUT/tests.txt" 2>&1
timeout 170 python3 benchmarks/probe.py agree --cpu resnet18,mlp_block --out "$OUT/agree.json" \
    --models resnet18,resnet50,resnext50_32x4d,mobilenet_v3_large,efficientnet_b0,convnext_tiny,regnet_y_400mf,vit_b_16,swin_t,tiny_gpt,mlp_block \
    > "$OUT/agree.log" 2>&1
timeout 40 python3 -m preclint check examples/mixed_precision_pitfalls.py --probe cuda --color never --exit-zero \
    > "$OUT/example_check.txt" 2>&1
tail -5 "$OUT/tests.txt"; grep -E '"(probe_seconds|forward_fp32_seconds|probe_over_forward|ablation_seconds)"' "$OUT/speed_resnet50_b32.json"; cat "$OUT/agree.log"
