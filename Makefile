# Two set-up commands for a fresh machine (see README.md):
#   make demo   the main job (~30 min on 2 CPU cores): the sentence Transformer, then FINAL
#               finetuned from it, on the Bible; both translate the test books, scored side by
#               side with the Delta_BLEU of random context and paired significance
#   make test   run the default test suite (what .ci/run calls)
# Both create or reuse the virtual environment in $(VENV) and install what they need.
# make results      every model on the Bible, one budget -> docs/results.md (hours; resumable)
# make results ARGS=--converged  every row until its dev BLEU stops improving ->
#                   docs/results_converged.md (many CPU hours; resumable across sessions)
# make results-quick  (or make results ARGS=--quick) the table's columns for a sentence row, a
#                   document row, a finetuned row and its control, with tiny models: minutes

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
DATA ?= data/bible

.PHONY: venv sword data demo results results-quick test notebooks test-slow test-jax-next lint \
	clean accelerator-wheels

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

# The SWORD Bible modules come from Debian packages (apt-get, needs root or sudo).
sword:
	bash launch/install_sword.sh

data: venv sword
	$(BIN)/python launch/prepare_data.py --corpus bible --out $(DATA)

# The main job: the sentence Transformer trained on the Bible for DEMO_SENTENCE_STEPS, FINAL
# finetuned from it for DEMO_DOCUMENT_STEPS, three test books translated (beam 5) by both and
# by FINAL with random context, scored side by side with paired significance, and the verses
# the context changed most; every step's command is printed. ARGS: more launch/demo.py flags
# (--proof: the synthetic context task first).
DEMO_SENTENCE_STEPS ?= 1650
DEMO_DOCUMENT_STEPS ?= 300
demo: data
	$(BIN)/python launch/demo.py --sentence_steps $(DEMO_SENTENCE_STEPS) \
		--document_steps $(DEMO_DOCUMENT_STEPS) $(ARGS)

# Every registered model and the key variants on the Bible with the same budget in real target
# tokens (experiments/results.py; rerun to resume): docs/results.md and docs/results.json.
results: data
	$(BIN)/python experiments/results.py $(ARGS)

# Without the SWORD modules (no root) the quick run uses the synthetic corpus, and says so.
results-quick: venv
	SWORD_OPTIONAL=1 bash launch/install_sword.sh
	test -s $(DATA)/test.tsv || $(BIN)/python launch/prepare_data.py --corpus bible --out $(DATA) \
	  || echo "WARNING: the Bible could not be prepared; results-quick uses the synthetic corpus"
	$(BIN)/python experiments/results.py --quick --data_dir $(DATA) $(ARGS)

# Two pytest workers (pytest-xdist), one test file each at a time: most of a test's time is
# XLA compilation, which uses one core. Files go out in collection order, heaviest first
# (tests/conftest.py), not xdist's most-tests-first, which would leave the one-test accelerator
# smoke to run alone at the end. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
TEST_FLAGS = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: venv
	SWORD_OPTIONAL=1 bash launch/install_sword.sh
	$(BIN)/python -m pytest -q -ra --durations=40 $(TEST_FLAGS)

# The notebooks executed end to end in fresh kernels (tests marked `notebook`; .ci/run runs
# them after the default suite).
notebooks: venv
	$(BIN)/python -m pytest -q -ra -m notebook $(TEST_FLAGS)

test-slow: venv sword
	$(BIN)/python -m pytest -q -ra -m slow $(TEST_FLAGS)
	$(MAKE) test-jax-next

# The accelerator's stack on CPU (requirements-jax-next.txt: jax 0.11.2 on Python 3.12, no
# TensorFlow): the device-path tests, so an API drift is caught before a device is lent.
# The first Python 3.12 that runs (a pyenv shim of a version not selected does not).
PYTHON_NEXT ?= $(shell for p in $$(command -v python3.12) $$(ls -d $$HOME/.pyenv/versions/3.12*/bin/python 2>/dev/null); do $$p -c "" 2>/dev/null && { echo $$p; break; }; done)
VENV_NEXT ?= .venv-next
NEXT_TESTS ?= tests/test_attention_bf16.py tests/test_accelerator_run.py \
	tests/test_translation_golden.py tests/test_loader.py tests/test_accumulation_ema.py \
	tests/test_model_interface.py tests/test_beam_search.py
test-jax-next: $(VENV_NEXT)/.installed
	$(VENV_NEXT)/bin/python -m pytest -q -ra -p no:cacheprovider -m "not slow or accelerator or device_stack" \
	  $(TEST_FLAGS) $(NEXT_TESTS)

$(VENV_NEXT)/.installed: requirements-jax-next.txt pyproject.toml setup.py
	@test -n "$(PYTHON_NEXT)" || { echo "test-jax-next: error: no Python 3.12 found (set PYTHON_NEXT=/path/to/python3.12)" >&2; exit 2; }
	test -x $(VENV_NEXT)/bin/python || $(PYTHON_NEXT) -m venv $(VENV_NEXT)
	$(VENV_NEXT)/bin/python -m pip install -q --upgrade pip
	$(VENV_NEXT)/bin/python -m pip install -q -r requirements-jax-next.txt
	$(VENV_NEXT)/bin/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

# What a lent accelerator machine lacks (docs/accelerators.md): the ml_collections wheel (pure
# Python) in .whl/, for the device's Python 3.12; carry .whl and data/bible with the checkout.
accelerator-wheels: venv
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp -d .whl ml_collections==1.1.0

lint: venv
	$(BIN)/ruff check docnmt_jax launch experiments tests configs notebooks

clean:
	rm -rf $(VENV) $(VENV_NEXT) data runs .pytest_cache
