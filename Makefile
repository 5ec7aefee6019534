# Set-up is automatic: `make train` and `make test` create .venv on first use.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
NPROC   ?= $(shell nproc)
ARGS    ?=
# pip Open MPI refuses root without these; on 2 cores tests need more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
# the launcher relays SIGTERM/Ctrl-C so the ranks checkpoint before stopping (see README)
LAUNCH  := $(BIN)/python -m mpippo.launch --mpirun-args=--oversubscribe

.PHONY: venv train test test-fast bench clean help

help:
	@echo "make train      install if needed, then mpirun -n $(NPROC) run_mpi.py on configs/ppo_procgen.yaml (ARGS='...' adds options)"
	@echo "make test       install if needed, then the whole suite (unit, MPI, smoke, learning)"
	@echo "make test-fast  the suite without the tests marked slow (learning, resilience, Slurm)"
	@echo "make bench      PPO throughput at 1, 2 and 4 ranks, DQN collection and learner speed -> benchmarks/results/"

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

train: venv
	$(LAUNCH) -n $(NPROC) $(ARGS)

test: venv
	$(BIN)/python -m pytest -q tests

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow" tests

bench: venv
	$(BIN)/python benchmarks/bench.py $(ARGS)
	$(BIN)/python benchmarks/bench_dqn.py

clean:
	rm -rf $(VENV) .pytest_cache
