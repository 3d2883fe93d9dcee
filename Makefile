# The two commands README.md gives. Each installs what it needs (scripts/setup.sh).
VENV ?= .venv
export DVC_NO_ANALYTICS = 1
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup repro test bench
setup:
	bash scripts/setup.sh

# 1. set everything up and regenerate every table and figure (default offline profile)
repro: setup
	dvc repro

# 2. the test suite (what CI runs)
test: setup
	python -m pytest -q

bench: setup
	python benchmarks/bench_fedavg.py
	python benchmarks/bench_engines.py
