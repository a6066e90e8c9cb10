#!/bin/bash
# One node of 8 x 80 GB GPUs (H100 80GB HBM3 or A100 80GB; planned at 79.6 GB, the H100's 81,559 MiB):
# Qwen3-8B-Base, config experiments/configs/rstar2_8b_8x80gb.json, one process. RL micro-batches of 8 rows (1 per device), SFT of 16, four TP-2 engines with 24 GB K/V pools each.
# Plan: python -m rstar2_jax.run.plan --config experiments/configs/rstar2_8b_8x80gb.json --device-memory 79.6
# (table and what changed from the paper in experiments/configs/README.md).
#   bash experiments/configs/rstar2_8b_8x80gb.sh            # start
#   bash experiments/configs/rstar2_8b_8x80gb.sh --resume   # continue after a crash
# Memory: the plan fits the run into memory_fraction (the config's) of each device's memory; XLA is told
# the same share (XLA_PYTHON_CLIENT_MEM_FRACTION, read from the config; the recipe refuses a mismatch) and
# preallocates it (XLA_PYTHON_CLIENT_PREALLOCATE=true, the BFC allocator the plan's limit is). The
# recipe reads XLA's limit (bytes_limit) itself; RSTAR2_DEVICE_MEMORY_GB (physical GB) is not needed.
set -euo pipefail
CONFIG=experiments/configs/rstar2_8b_8x80gb.json
RUN_DIR=${RUN_DIR:-runs/rstar2_8b_8x80gb}
MEM_FRACTION=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["memory_fraction"])' "$CONFIG")
export XLA_PYTHON_CLIENT_MEM_FRACTION="$MEM_FRACTION" XLA_PYTHON_CLIENT_PREALLOCATE=true
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1,2,3,4,5,6,7}
exec python experiments/rstar2_recipe.py --config "$CONFIG" --out "$RUN_DIR" "$@"
