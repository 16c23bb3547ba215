#!/usr/bin/env bash
# Install (idempotent, seconds when up to date) and run the whole test suite.
#   bash tools/run_tests.sh [pytest args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
VENV="$VENV" bash "$ROOT/tools/install.sh"
cd "$ROOT"
start=$(date +%s)
set +e
"$VENV/bin/python" -m pytest tests "$@"
rc=$?
set -e
echo "[tests] finished in $(( $(date +%s) - start )) s (exit $rc)"
exit $rc
