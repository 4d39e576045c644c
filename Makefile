# The two set-up commands of the README. Both work on a fresh machine: they install what they need.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: quickstart test install install-test benchmarks

# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[all]"

install-test: install

quickstart: install
	$(PYTHON) -m agentgym.quickstart --out runs/quickstart

test: install-test
	$(PYTHON) -m pytest -q -p no:cacheprovider

benchmarks: install
	$(PYTHON) benchmarks/rollout_throughput.py
	$(PYTHON) benchmarks/train_step.py
