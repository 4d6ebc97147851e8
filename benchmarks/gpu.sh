#!/usr/bin/env bash
# The GPU rows of docs/benchmarks.md: the gpu tests, then every CUDA benchmark with --record
# (written to docs/benchmark_results/). `make bench-gpu` runs it in the project's .venv; on a
# machine without it: PYTHON=python3 benchmarks/gpu.sh. Each step is bounded by STEP_TIMEOUT
# seconds (default 300) and a failed step does not stop the others; the exit status counts them.
# Ctrl-C stops the running step and the script.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
failed=0
pid=""
trap '[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; echo "!! interrupted"; exit 130' INT TERM
step() {
	local start=$SECONDS rc=0
	echo "== $*"
	# in the background, so that the trap runs at once (timeout puts its child in its own group)
	timeout -k 30 "$STEP_TIMEOUT" "$PYTHON" "$@" &
	pid=$!
	wait "$pid" || rc=$?
	pid=""
	if [ "$rc" -ne 0 ]; then
		echo "!! failed (rc $rc): $*"
		failed=$((failed + 1))
	fi
	echo "== $((SECONDS - start)) s"
}
step -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py
vit_b=(--model vit_base_patch16_224)
step benchmarks/gradcam.py --device cuda "${vit_b[@]}" --batch 64 --record
step benchmarks/gradcam.py --device cuda "${vit_b[@]}" --batch 64 --dtype bfloat16 --record
step benchmarks/capture.py --device cuda --models vit_base_patch16_224 --batch 64 --record
step benchmarks/capture.py --device cuda --models vit_base_patch16_224 --batch 64 --dtype bfloat16 --record
step benchmarks/rollout.py --device cuda --size 518 --batch 32 --repeats 3 --record
cka=(benchmarks/cka.py --device cuda "${vit_b[@]}" --images 2048 --batch 128 --methods forward,vizkit --rounds 3)
step "${cka[@]}" --record
step "${cka[@]}" --dtype bfloat16 --record
step benchmarks/cka_kernels.py --device cuda "${vit_b[@]}" --batch 128 --record
step benchmarks/masks.py --device cuda --batch 256 --record
step benchmarks/sot.py --device cuda --record
step benchmarks/sot.py --what model --device cuda --batch 256 --record
echo "$failed step(s) failed"
exit "$failed"
