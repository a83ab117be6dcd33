#!/usr/bin/env bash
# One device call of the GPU kit (bench/gpu/README.md): bash bench/gpu/run.sh 1|2|3 [options]
# The box's python3 holds torch; what it prints also lands in $OUT/call-<n>.log, which comes
# back even when the call is stopped at its limit.
set -o pipefail
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-bench/out/gpu}
mkdir -p "$out"
PYTHONUNBUFFERED=1 "${PYTHON:-python3}" bench/gpu/run.py --out "$out" "$@" 2>&1 \
  | tee "$out/call-$1.log"
