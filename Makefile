# The two set-up commands of the README. Both work on a fresh machine: they install what they need.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: quickstart test test-slow install install-test system-deps benchmarks

# System packages the tests use: bubblewrap (the Python sandbox), docker.io (the Docker sandbox backend;
# tests start their own dockerd), git (SWE patches), stockfish (the chess opponent, a separate GPL program) and
# chromium (the web/GUI envs drive the system Chromium; `playwright install` cannot download here) and
# default-jre-headless (the Java runtime of ScienceWorld's simulator).
# Installed with apt-get when missing; elsewhere a warning says what to add.
SYSTEM_PACKAGES := bubblewrap docker.io git stockfish chromium default-jre-headless

# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[all]"

system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "WARNING: install these system packages yourself:$$missing (sandbox tests need them)"; exit 0; fi; \
	sudo=""; [ "$$(id -u)" = 0 ] || sudo="sudo"; \
	echo "Installing system packages:$$missing"; \
	$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing >/dev/null

install-test: system-deps install

# `make quickstart` installs nothing when what it imports is there (a find_spec check, well under a second), so a
# second run starts at once. When something is missing it installs agentgym[train] (not [all]) with pip's own
# output: into the active virtual environment, else into $(VENV), created with access to the system's packages (an
# installed torch is reused, not downloaded again) so that the system or pyenv Python is never re-pointed at this
# checkout. A later `make quickstart` uses $(VENV) when no other environment is active.
VENV ?= .venv
QUICKSTART_ARGS ?=
QUICKSTART_CHECK := import importlib.util as u, os, sys; \
	need = ("gymnasium", "numpy", "jsonschema", "yaml", "rich", "httpx", "torch", "transformers", "tokenizers", \
	        "safetensors", "matplotlib"); \
	missing = [n for n in need if u.find_spec(n) is None]; \
	t = None if missing else u.find_spec("agentgym.trainers"); \
	here = t is not None and os.path.realpath(t.origin).startswith(os.path.realpath("trainers") + os.sep); \
	missing += [] if here or missing else ["agentgym installed from this checkout"]; \
	print(", ".join(missing)); sys.exit(1 if missing else 0)

quickstart:
	@py="$(PYTHON)"; active="$${VIRTUAL_ENV:-$$CONDA_PREFIX}"; \
	if [ -z "$$active" ] && [ -x "$(VENV)/bin/python" ]; then py="$(VENV)/bin/python"; fi; \
	if missing=$$($$py -c '$(QUICKSTART_CHECK)' 2>&1); then \
		echo "quickstart: everything it needs imports in $$py: nothing to install"; \
	else \
		echo "quickstart: $$py lacks: $$missing"; \
		if [ -z "$$active" ] && [ "$$py" = "$(PYTHON)" ]; then \
			echo "quickstart: no virtual environment is active: creating $(VENV) (it sees the system's packages; $(PYTHON) itself is left unchanged)"; \
			$(PYTHON) -m venv --system-site-packages $(VENV) || exit 1; py="$(VENV)/bin/python"; \
		fi; \
		echo "quickstart: installing agentgym[train] into $$py (minutes the first time; pip's progress follows)"; \
		$$py -c "import torch" 2>/dev/null || $$py -m pip install torch==2.13.0 || exit 1; \
		$$py -m pip install -e ".[train]" || exit 1; \
	fi; \
	echo "quickstart: $$py -m agentgym.cli.quickstart --out runs/quickstart $(QUICKSTART_ARGS)"; \
	$$py -m agentgym.cli.quickstart --out runs/quickstart $(QUICKSTART_ARGS)

# The default run: everything but the `slow` tests (whole-suite validations, long learning and container runs),
# three test files at a time (most tests wait on browsers, sandboxes, servers and subprocesses, not on the CPU; four
# at a time was no faster on 2 cores and made browser timeouts flaky).
TEST_WORKERS ?= 3
# Bytecode writing on (some machines set PYTHONDONTWRITEBYTECODE): pytest caches its rewritten test modules as .pyc,
# so later runs and workers skip about 15 s of rewriting and compiling each.
# A test that hangs fails after 10 minutes with its threads' stacks (the longest takes under 90 s), and a test
# worker that dies ends the run at once, naming its test: pytest-xdist's replacement worker can wait forever under
# --dist loadfile (pytest-xdist issue 784), which turned one crashed worker into a CI run that never finished.
# The run ends with its 25 slowest tests, where time to trim is found.
test: install-test
	env -u PYTHONDONTWRITEBYTECODE $(PYTHON) -m pytest -q -p no:cacheprovider -m "not slow" -n $(TEST_WORKERS) --dist loadfile \
		--timeout 600 --max-worker-restart 0 --durations 25

# The `slow` tests alone (about an hour on 2 cores): full validations of the big suites, learning runs, images.
test-slow: install-test
	env -u PYTHONDONTWRITEBYTECODE $(PYTHON) -m pytest -q -p no:cacheprovider -m slow

benchmarks: install
	$(PYTHON) benchmarks/rollout_throughput.py
	$(PYTHON) benchmarks/train_step.py
	$(PYTHON) benchmarks/logprob_memory.py
	$(PYTHON) benchmarks/hf_kv_cache.py
	$(PYTHON) benchmarks/sandbox_latency.py
	$(PYTHON) benchmarks/swe.py
	$(PYTHON) benchmarks/multi_agent.py
	$(PYTHON) benchmarks/browser.py
	$(PYTHON) benchmarks/retrieval.py
	$(PYTHON) benchmarks/grader_accuracy.py
	$(PYTHON) benchmarks/ray_rollouts.py
	$(PYTHON) benchmarks/async_training.py
	$(PYTHON) benchmarks/env_server.py
	$(PYTHON) benchmarks/new_envs.py
