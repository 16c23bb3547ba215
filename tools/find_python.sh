# Sourced by dist_train.sh, dist_test.sh and slurm_train.sh: sets PYTHON to the
# project's interpreter, so they work without an activated virtual environment.
#   $PYTHON if set; else $VENV/bin/python (VENV as for tools/install.sh, default
#   <checkout>/.venv) if it exists; else the `python` on PATH.
if [[ -z "${PYTHON:-}" ]]; then
  _moppa_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  _moppa_venv="${VENV:-$_moppa_root/.venv}"
  if [[ -x "$_moppa_venv/bin/python" ]]; then
    PYTHON="$_moppa_venv/bin/python"
  else
    PYTHON=python
  fi
  unset _moppa_root _moppa_venv
fi
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "$(basename "$0"): '$PYTHON' cannot import torch. Activate the environment" \
    "moppa_mm is installed in, or set PYTHON=/path/to/python (or VENV=/path/to/venv)." >&2
  exit 1
fi
