#!/usr/bin/env bash
# The GPU rows of docs/benchmarks.md: the gpu tests, then every CUDA benchmark with --record
# (written to docs/benchmark_results/): every registered saliency method against the forward on
# ViT-B and on two transformers backbones (DINOv2 at 518 px, CLIP ViT-L/14 at 336 px), the
# mechanistic views, evaluate, the metrics, capture, CKA, reading ahead, rollout and the papers'
# mechanisms; then the host profile of capture and CKA and the beside-map variants (printed, for
# issue 52's item 3). `make bench-gpu` runs it in the project's .venv; on a machine without it:
# PYTHON=python3 benchmarks/gpu.sh. Each step is bounded (its own limit, or STEP_TIMEOUT seconds,
# default 25; the method_cost steps stop their methods at --budget and record what they measured),
# and the whole script by TOTAL seconds (default 480): a step whose bound no longer fits in what
# is left of them (less a 10 s reserve for stopping a step) is skipped, so the script ends within
# TOTAL and no step is cut short; the steps run most important first. A failed step does not stop
# the others; the exit status counts the failed and the skipped steps. Ctrl-C stops the running
# step and the script.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
STEP_TIMEOUT=${STEP_TIMEOUT:-25}
TOTAL=${TOTAL:-480}
for bound in "$STEP_TIMEOUT" "$TOTAL"; do
	[[ $bound =~ ^[0-9]+$ ]] || { echo "STEP_TIMEOUT and TOTAL are whole seconds; got '$bound'"; exit 2; }
done
end=$((SECONDS + TOTAL))
failed=0
skipped=0
pid=""
trap '[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; echo "!! interrupted"; exit 130' INT TERM
step() {  # LIMIT=seconds before it: that step's own bound
	local start=$SECONDS rc=0 limit=${LIMIT:-$STEP_TIMEOUT} left=$((end - SECONDS - 10))
	if ! [[ $limit =~ ^[0-9]+$ ]]; then
		echo "!! failed (LIMIT is whole seconds; got '$limit'): $*"
		failed=$((failed + 1))
		return
	fi
	if [ "$limit" -gt "$left" ]; then
		echo "!! skipped (its $limit s do not fit in the $left s left of TOTAL=$TOTAL): $*"
		skipped=$((skipped + 1))
		return
	fi
	echo "== $* (at most $limit s)"
	# in the background, so that the trap runs at once (timeout puts its child in its own group)
	timeout -k 10 "$limit" "$PYTHON" "$@" &
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
cost=(benchmarks/method_cost.py --device cuda --repeats 1 --record)
LIMIT=110 step "${cost[@]}" "${vit_b[@]}" --batch 32 --budget 100
backbone_methods=saliency,gradcam,attnlrp,legrad,smoothgrad,integrated_gradients,grad_rollout
LIMIT=50 step "${cost[@]}" --model hf_dinov2_base --size 518 --batch 8 --methods "$backbone_methods" --budget 42
LIMIT=60 step "${cost[@]}" --model hf_clip_vit_l14 --size 336 --batch 16 --methods "$backbone_methods" --budget 52
step benchmarks/mechanistic.py --device cuda --record
LIMIT=40 step benchmarks/evaluate.py --device cuda --record
LIMIT=30 step benchmarks/metrics.py --device cuda --repeats 2 --record
# issue 54's GPU rows: writing a store against the forward (disk rate beside it), and SAE
# training tokens/s against Overcomplete on the same store (printed to the log)
LIMIT=30 step benchmarks/store.py --device cuda --images 512 --batch 64 --repeats 2
LIMIT=40 step benchmarks/sae.py --device cuda --images 512 --rows 8192 --expansion 16 --epochs 2 --repeats 2
LIMIT=60 step benchmarks/scale.py --device cuda --rows decomposition,browser,store --repeats 2 --record
LIMIT=120 step benchmarks/scale.py --device cuda --rows analyses --repeats 2 --record
step benchmarks/gradcam.py --device cuda "${vit_b[@]}" --batch 64 --dtype bfloat16 --record
step benchmarks/capture.py --device cuda --models vit_base_patch16_224 --batch 64 --dtype bfloat16 --record
step benchmarks/rollout.py --device cuda --size 518 --batch 32 --repeats 3 --record
LIMIT=50 step benchmarks/cka.py --device cuda "${vit_b[@]}" --images 2048 --batch 128 --methods forward,vizkit --rounds 2 --processes 1 --record
LIMIT=40 step benchmarks/read_ahead.py --device cuda --images 2048 --batch 128 --eval-images 64 --repeats 2 --record
LIMIT=40 step benchmarks/host_profile.py --device cuda --dtype bfloat16 --batch 64 --images 512
LIMIT=20 step benchmarks/beside_map.py
step benchmarks/cka_kernels.py --device cuda "${vit_b[@]}" --batch 128 --record
step benchmarks/masks.py --device cuda --batch 256 --record
step benchmarks/sot.py --device cuda --record
echo "$failed step(s) failed, $skipped skipped"
exit $((failed + skipped))
