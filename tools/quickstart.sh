#!/usr/bin/env bash
# The README's first command: install (idempotent), make the demo data, then the
# main job end to end on CPU: MoPPA Cascade Mask R-CNN (small Swin) trains 2 epochs
# on a generated COCO-format shapes set, evaluates bbox + segm AP with pycocotools,
# saves adapter-only checkpoints, and tools/test.py re-evaluates the last one.
#   bash tools/quickstart.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
VENV="$VENV" bash "$ROOT/tools/install.sh"
cd "$ROOT"
PY="$VENV/bin/python"
CONFIG=configs/demo/cascade-mask-rcnn_moppa-swin-demo_fpn_shapes.py
WORK_DIR=work_dirs/quickstart
start=$(date +%s)

[[ -f data/shapes_demo/annotations/val.json ]] || "$PY" -m moppa_mm.demo --root data/shapes_demo
rm -rf "$WORK_DIR"
"$PY" tools/train.py "$CONFIG" --work-dir "$WORK_DIR"
CKPT="$WORK_DIR/epoch_2.pth"
"$PY" tools/test.py "$CONFIG" "$CKPT" --work-dir "$WORK_DIR/test"

echo
echo "[quickstart] adapter-only checkpoint: $CKPT ($(du -h "$CKPT" | cut -f1), adapters + neck/heads + optimizer state)"
echo "[quickstart] test metrics: $(ls -t "$WORK_DIR"/test/*/*.json | head -1)"
echo "[quickstart] done in $(( $(date +%s) - start )) s"
