#!/usr/bin/env bash
# Install (idempotent, seconds when up to date) and run the whole test suite.
#   bash tools/run_tests.sh [pytest args...]   (a test path among them: only those tests)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
VENV="$VENV" bash "$ROOT/tools/install.sh"
cd "$ROOT"
start=$(date +%s)
set +e
# the whole suite, unless a test path is given: run_tests.sh tests/test_operators -q
paths=(tests)
for arg in "$@"; do
  [[ "$arg" != -* && -e "$arg" ]] && paths=()
done
"$VENV/bin/python" -m pytest "${paths[@]}" "$@"
rc=$?
set -e
echo "[tests] finished in $(( $(date +%s) - start )) s (exit $rc)"
exit $rc
