# Two set-up commands for a fresh machine (see README.md):
#   make demo   prepare the Bible corpus, train a Transformer within DEMO_MINUTES, translate, score
#   make test   run the default test suite (what .ci/run calls)
# Both create or reuse the virtual environment in $(VENV) and install what they need.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
DATA ?= data/bible

.PHONY: venv sword data demo test test-slow lint clean

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
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

# The main job: prepare the corpus, train the sentence Transformer (TED size) within
# DEMO_MINUTES, translate the test books with beam 5 and score them (s-BLEU, d-BLEU, chrF).
DEMO_MINUTES ?= 20
DEMO_WORKDIR ?= runs/demo_transformer
demo: data
	$(BIN)/python launch/train.py --config configs/transformer.py --workdir $(DEMO_WORKDIR) \
	  --config.data.data_dir=$(DATA) --config.train.time_budget_minutes=$(DEMO_MINUTES) \
	  --config.train.warmup_steps=400 --config.train.lr_scale=0.5 \
	  --config.train.eval_every=300 --config.train.checkpoint_every=300
	$(BIN)/python launch/translate.py --workdir $(DEMO_WORKDIR) --input $(DATA)/test.tsv \
	  --output $(DEMO_WORKDIR)/test.hyp.tsv --beam 5 --alpha 0.6
	$(BIN)/python launch/evaluate.py --hyp $(DEMO_WORKDIR)/test.hyp.tsv --ref $(DATA)/test.tsv
	@echo "translations: $(DEMO_WORKDIR)/test.hyp.tsv  references: $(DATA)/test.tsv"

# Two pytest workers (pytest-xdist), one test file each at a time: most of a test's time is
# XLA compilation, which uses one core. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
TEST_FLAGS = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: venv
	SWORD_OPTIONAL=1 bash launch/install_sword.sh
	$(BIN)/python -m pytest -q -ra --durations=15 $(TEST_FLAGS)

test-slow: venv sword
	$(BIN)/python -m pytest -q -ra -m slow $(TEST_FLAGS)

lint: venv
	$(BIN)/ruff check docnmt_jax launch tests configs notebooks

clean:
	rm -rf $(VENV) data runs .pytest_cache
