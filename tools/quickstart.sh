#!/usr/bin/env bash
# The README's first command: install (idempotent), make the demo data, then the
# main job end to end on CPU: MoPPA Cascade Mask R-CNN (small Swin) trains 2 epochs
# on a generated COCO-format shapes set, evaluates bbox + segm AP with pycocotools,
# saves adapter-only checkpoints, and tools/test.py re-evaluates the last one.
#   bash tools/quickstart.sh
# The classification path instead (about half a minute): a generated VTAB-1K-format task
# and a small MAE-format ViT, converted by our converter, trained 4 epochs, re-tested.
#   bash tools/quickstart.sh cls
set -euo pipefail
MODE="${1:-det}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
VENV="$VENV" bash "$ROOT/tools/install.sh"
cd "$ROOT"
PY="$VENV/bin/python"

if [[ "$MODE" == cls ]]; then
  CONFIG=configs/demo/moppa_vit-demo_mae-pre_vtab1k-eurosat.py
  WORK_DIR=work_dirs/quickstart_cls
  start=$(date +%s)
  [[ -f data/vtab_demo/eurosat/test.txt ]] || "$PY" tools/demo/vtab_task.py --root data/vtab_demo
  "$PY" tools/model_converters/vit_to_mmpretrain.py mae \
    data/vtab_demo/mae_pretrain_vit_demo.pth data/vtab_demo/vit_demo_mmpretrain.pth
  rm -rf "$WORK_DIR"
  "$PY" tools/train.py "$CONFIG" --work-dir "$WORK_DIR"
  "$PY" tools/test.py "$CONFIG" "$WORK_DIR/epoch_4.pth" --work-dir "$WORK_DIR/test"
  echo
  echo "[quickstart cls] test metrics: $(ls -t "$WORK_DIR"/test/*/*.json | head -1)"
  echo "[quickstart cls] done in $(( $(date +%s) - start )) s"
  exit 0
elif [[ "$MODE" != det ]]; then
  echo "usage: bash tools/quickstart.sh [det|cls]" >&2
  exit 2
fi
CONFIG=configs/demo/cascade-mask-rcnn_moppa-swin-demo_fpn_shapes.py
WORK_DIR=work_dirs/quickstart
start=$(date +%s)

[[ -f data/shapes_demo/annotations/val.json ]] || "$PY" tools/demo/coco_shapes.py --root data/shapes_demo
rm -rf "$WORK_DIR"
"$PY" tools/train.py "$CONFIG" --work-dir "$WORK_DIR"
CKPT="$WORK_DIR/epoch_2.pth"
"$PY" tools/test.py "$CONFIG" "$CKPT" --work-dir "$WORK_DIR/test"

echo
echo "[quickstart] adapter-only checkpoint: $CKPT ($(du -h "$CKPT" | cut -f1), adapters + neck/heads + optimizer state)"
echo "[quickstart] test metrics: $(ls -t "$WORK_DIR"/test/*/*.json | head -1)"
echo "[quickstart] done in $(( $(date +%s) - start )) s"
