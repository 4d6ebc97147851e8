#!/usr/bin/env bash
# One short GPU lease, used whole: `make bench-gpu`'s steps (benchmarks/gpu.sh, bounded), then
# the ledgers' GPU sweep for what remains of MINUTES, its finished models packed into OUT for
# `python docs/findings/sweeps.py adopt .sweep/gpu OUT/models-*.tar` (docs/guide/data-and-zoo.md).
#   MINUTES=12 OUT=/some/dir [PYTHON=python3] [JOBS=8] [ZOO=/tmp/zoo] benchmarks/gpu_lease.sh
# `make gpu-lease MINUTES=12 OUT=...` runs it in the project's .venv. The sweep's recipes are
# .sweep/gpu when it exists (written where the zoo's checkpoints are, by `make findings-gpu` or
# `sweeps.py write gpu .sweep/gpu`), else written here. A run the lease cuts short leaves no
# model (checkpoints are written whole).
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
MINUTES=${MINUTES:-12}
OUT=${OUT:?OUT: the folder the benchmark log and the packed models go to}
JOBS=${JOBS:-8}
ZOO=${ZOO:-/tmp/zoo}
mkdir -p "$OUT"
deadline=$((SECONDS + MINUTES * 60))
total=$((MINUTES * 60 - 70))  # the benchmarks' bound: a minute kept for packing, 10 s reserve
[ "$total" -le 480 ] || total=480
PYTHON=$PYTHON TOTAL=$total timeout -k 10 $((MINUTES * 60 - 60)) bash benchmarks/gpu.sh 2>&1 | tee "$OUT/bench.log"
left=$(((deadline - SECONDS - 60) / 60))  # a minute kept for packing
echo "== benchmarks done; $left minute(s) left for the sweep"
[ "$left" -ge 1 ] || exit 0
[ -d .sweep/gpu ] || "$PYTHON" docs/findings/sweeps.py write gpu .sweep/gpu
set -- .sweep/gpu/*.json
if [ -e "$1" ]; then
	VIZKIT_MODELS=$ZOO timeout -k 10 $((left * 60)) "$PYTHON" -m vizkit.cli train "$@" \
		--device cuda --jobs "$JOBS" --stop-after "$left" 2>&1 | tee "$OUT/sweep.log"
fi
[ -d "$ZOO" ] && "$PYTHON" docs/findings/sweeps.py pack "$ZOO" "$OUT"
ls -la "$OUT"
