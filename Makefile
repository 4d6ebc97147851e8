# The README's contract: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export VIZKIT_FAST ?= 1
export HF_HUB_OFFLINE ?= 1
export NO_MKDOCS_2_WARNING ?= 1
# make docs executes the notebooks for the tutorials; make test builds without (nbval ran them)
export VIZKIT_DOCS_EXECUTE ?= true

.PHONY: setup demo test unit versions notebooks docs findings findings-gpu findings-cpu lab bench bench-gpu gpu-lease lint strip clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --no-cache-dir --upgrade pip
	$(BIN)/python -m pip install --no-cache-dir -e ".[dev,docs,transformers,open_clip]"
	# test oracles without their own requirements: LXT (AttnLRP; its LLM extras, bitsandbytes,
	# ...), Quantus (metrics; opencv-python beside grad-cam's headless OpenCV), TransformerLens
	# (direct logit attribution; of its requirements only what its import needs, no wandb) and
	# Overcomplete (sparse autoencoders; opencv-python again)
	$(BIN)/python -m pip install --no-cache-dir --no-deps "lxt==2.1" "quantus==0.6.0" \
		"overcomplete==0.3.0" \
		"transformer-lens==4.3.0" "einops==0.8.2" "jaxtyping==0.3.11" "datasets==5.2.0" \
		"multiprocess==0.70.19" "pyarrow==26.0.1" "dill==0.4.1" "xxhash==4.1.0" \
		"accelerate==1.15.0"
	touch $(STAMP)

demo: setup
	$(BIN)/vizkit report --out report

test: lint unit versions notebooks
	$(MAKE) docs VIZKIT_DOCS_EXECUTE=false

# the lowest library versions pyproject.toml declares (.ci/versions: the family, beyond-timm
# and embedding-target tests in an environment of its own)
versions: setup
	.ci/versions

# one pytest-xdist worker per core (each module's tests in one worker: its module fixtures are
# built once); --durations: the slowest tests, printed where the 20-minute budget of `make
# test` is watched
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
unit: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --durations=30

notebooks: setup
	$(BIN)/python -m pytest -q --nbval-lax --nbval-current-env \
		--nbval-sanitize-with notebooks/nbval_sanitize.cfg --nbval-cell-timeout=300 \
		-p no:cacheprovider notebooks/

docs: setup
	$(BIN)/python docs/generate.py
	$(BIN)/mkdocs build --strict --quiet

# the paper pages' measured findings (docs/findings/<paper>.json), after retraining a zoo model;
# then the ledgers' Shapes models on a ten times larger test set (test_size.json, 30 minutes)
findings: setup
	$(BIN)/python docs/findings/record.py
	$(BIN)/python docs/findings/test_size.py

# the ledgers' deciding sweeps (docs/findings/sweeps.py), on a GPU (JOBS side by side) or on
# this machine's CPU (two side by side, one thread each): the runs the zoo lacks, none started
# after MINUTES; then copy the new models' recipes into vizkit/train/recipes/ and give the
# ledger rows they serve (sweeps.py list) those seeds and budgets
JOBS ?= 8
MINUTES ?= 30
findings-gpu findings-cpu: findings-%: setup
	rm -rf .sweep/$* && $(BIN)/python docs/findings/sweeps.py write $* .sweep/$*
	set -- .sweep/$*/*.json; [ -e "$$1" ] || { echo "the zoo has every run of the sweep"; exit 0; }; \
	$(BIN)/vizkit train "$$@" $(if $(filter gpu,$*),--device cuda --jobs $(JOBS),--jobs 2) \
		--stop-after $(MINUTES)

lab: setup
	$(BIN)/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root)

bench: setup
	$(BIN)/python -m pip install -q -e ".[dev,bench]"
	$(BIN)/python benchmarks/capture.py --record
	$(BIN)/python benchmarks/gradcam.py --record
	$(BIN)/python benchmarks/saliency_methods.py --record
	$(BIN)/python benchmarks/metrics.py --record
	$(BIN)/python benchmarks/mechanistic.py --record
	$(BIN)/python benchmarks/cka.py --record
	$(BIN)/python benchmarks/cka_kernels.py --batch 32 --repeats 7 --record
	$(BIN)/python benchmarks/read_ahead.py --record
	$(BIN)/python benchmarks/evaluate.py --images 32 --batch 8 --repeats 5 --record
	$(BIN)/python benchmarks/widgets.py --record
	$(BIN)/python benchmarks/scale.py --record
	$(BIN)/python benchmarks/masks.py --record
	for m in 6 14 24 38; do $(BIN)/python benchmarks/sot.py --m $$m --record; done
	$(BIN)/python benchmarks/sot.py --what model --record
	$(BIN)/python benchmarks/saliency_table.py --record
	for t in 1 2; do $(BIN)/python benchmarks/saliency_cost.py --threads $$t --record; done
	$(BIN)/python benchmarks/report_settings.py --record
	$(BIN)/python benchmarks/report.py --against e024d58 --repeats 3 --record

# the GPU rows of docs/benchmarks.md (needs CUDA; `make bench` covers the CPU)
bench-gpu: setup
	$(BIN)/python -m pip install -q -e ".[dev,bench]"
	PYTHON=$(BIN)/python benchmarks/gpu.sh

# a short GPU lease used whole: bench-gpu's steps, then the ledgers' GPU sweep for the rest
# of MINUTES, the models packed into OUT for `sweeps.py adopt`
gpu-lease: setup
	$(BIN)/python -m pip install -q -e ".[dev,bench]"
	PYTHON=$(BIN)/python MINUTES=$(MINUTES) OUT=$(OUT) JOBS=$(JOBS) benchmarks/gpu_lease.sh

lint: setup
	$(BIN)/ruff check vizkit tests benchmarks notebooks docs/*.py docs/findings/*.py
	$(BIN)/ruff format --check vizkit tests benchmarks notebooks/strip_outputs.py docs/*.py docs/findings/*.py

strip: setup
	$(BIN)/python notebooks/strip_outputs.py notebooks/*.ipynb

clean:
	rm -rf $(VENV) .venv-versions build dist *.egg-info .pytest_cache .ruff_cache
