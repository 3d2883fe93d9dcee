# The two commands README.md gives. Each installs what it needs (scripts/setup.sh).
VENV ?= .venv
export DVC_NO_ANALYTICS = 1
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# our machines (CI's too) set PYTHONDONTWRITEBYTECODE=1: without a .pyc, every process that imports pflrepro (test
# workers, jobs workers, kernels, CLI subprocesses) compiles it again; here Python writes them (scripts/setup.sh)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup repro test test-full bench
setup:
	bash scripts/setup.sh

# 1. set everything up and regenerate every table and figure (default offline profile)
repro: setup
	dvc repro

# 2. the test suite (what CI runs): two pytest-xdist workers, one per core of our 2-core CI machines; tests are dealt
# one by one, except those marked with an xdist_group (one worker each); each worker's torch uses one thread (tests/conftest.py)
test: setup
	python -m pytest -q -n 2 --dist loadgroup -m "not full"

# 2b. everything `make test` runs, and the exhaustive cases marked `full` (every notebook renders on smoke; one
# round of every deep paper architecture on its stand-in): before a change to notebooks, params or models lands
test-full: setup
	python -m pytest -q -n 2 --dist loadgroup

bench: setup
	python benchmarks/bench_fedavg.py
	python benchmarks/bench_engines.py
