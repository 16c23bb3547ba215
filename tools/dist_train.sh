#!/usr/bin/env bash
# Distributed training with torchrun, used like mmdet's tools/dist_train.sh:
#   tools/dist_train.sh CONFIG NUM_PROCS [train.py args...]
# Multi-node: NNODES=2 NODE_RANK=0 MASTER_ADDR=host PORT=29500 tools/dist_train.sh ...
# Without CUDA the processes use gloo on the CPU.
CONFIG=$1
GPUS=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
source "$(dirname "$0")/find_python.sh"  # $PYTHON, else $VENV or .venv, else python

PYTHONPATH="$(dirname "$0")/..":$PYTHONPATH \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$(dirname "$0")/train.py" \
    "$CONFIG" \
    --launcher pytorch "${@:3}"
