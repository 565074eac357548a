#!/bin/bash
# The large-model figures (benchmarks/README.md, "Large models") on the two-GPU machine, from the
# repository root: PART=one runs the single-GPU runs, PART=two the two-GPU runs and the longer inputs,
# PART=ranks the 7B and 13B on one GPU and on two, one after the other; PART=shared the 1B and 7B with
# two ranks on a one-GPU machine.
# Each run's JSON and log go into $OUT/large_models_$PART.tar.gz (the device tool brings back few files).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/large-models}
RUNS=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$RUNS/gpu.txt" 2>&1
one() {  # name, timeout, arguments
  local name=$1 limit=$2; shift 2
  local start=$EPOCHREALTIME
  timeout "$limit" "$@" --out "$RUNS" > "$RUNS/$name.log" 2>&1
  echo "$name rc=$? wall_s=$(awk "BEGIN{print $EPOCHREALTIME - $start}")" | tee -a "$RUNS/runs.txt"
}

if [ "${PART:-one}" = one ]; then
  one 1b_unstreamed 150 python3 benchmarks/large_models.py --size 1b --mode unstreamed --repeat ${REPEAT:-4}
  one 1b_streamed 150 python3 benchmarks/large_models.py --size 1b --mode streamed --repeat ${REPEAT:-4}
  one 7b_unstreamed 150 python3 benchmarks/large_models.py --size 7b --mode unstreamed --repeat ${REPEAT:-4}
  one 7b_streamed 150 python3 benchmarks/large_models.py --size 7b --mode streamed --repeat ${REPEAT:-4}
  one 13b_streamed 180 python3 benchmarks/large_models.py --size 13b --mode streamed --repeat ${REPEAT:-4}
  python3 benchmarks/large_models.py --compare "$RUNS/1b_unstreamed.json" "$RUNS/1b_streamed.json" | head -5 | tee -a "$RUNS/runs.txt"
elif [ "${PART}" = two ]; then
  one 7b_distributed 180 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/large_models.py --size 7b --mode distributed --repeat ${REPEAT:-4}
  one 13b_distributed 200 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/large_models.py --size 13b --mode distributed --repeat ${REPEAT:-4}
  one 1b_unstreamed_2048 150 python3 benchmarks/large_models.py --size 1b --mode unstreamed --repeat ${REPEAT:-4} --tokens 2048
  one 7b_streamed_1024 180 python3 benchmarks/large_models.py --size 7b --mode streamed --repeat ${REPEAT:-4} --tokens 1024
elif [ "${PART}" = shared ]; then  # PART=shared: two ranks on a one-GPU machine (large_models.py --share-gpu)
  one 1b_unstreamed 150 python3 benchmarks/large_models.py --size 1b --mode unstreamed --repeat ${REPEAT:-4}
  one 1b_distributed_one_gpu 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/large_models.py --size 1b --mode distributed --repeat ${REPEAT:-4} --share-gpu
  one 7b_streamed 150 python3 benchmarks/large_models.py --size 7b --mode streamed --repeat ${REPEAT:-4}
  one 7b_distributed_one_gpu 200 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/large_models.py --size 7b --mode distributed --repeat ${REPEAT:-4} --share-gpu
else  # PART=ranks: one GPU against two on the same machine
  one 7b_unstreamed 150 python3 benchmarks/large_models.py --size 7b --mode unstreamed --repeat ${REPEAT:-4}
  one 13b_streamed 180 python3 benchmarks/large_models.py --size 13b --mode streamed --repeat ${REPEAT:-4}
  one 7b_distributed 180 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/large_models.py --size 7b --mode distributed --repeat ${REPEAT:-4}
  one 13b_distributed 200 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/large_models.py --size 13b --mode distributed --repeat ${REPEAT:-4}
fi
mkdir -p "$OUT"
tar -czf "$OUT/large_models_${PART:-one}.tar.gz" -C "$RUNS" .
for f in "$RUNS"/*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/',1)[1], {k: round(d[k], 2) for k in ('check_s','probe_s','bare_s','over_bare','gpu_peak_gib','host_peak_gib')})" "$f"; done
