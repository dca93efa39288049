# The two commands of the README. Each installs libtorch first if it is missing.
.PHONY: setup train test
setup:
	@./scripts/setup-libtorch.sh
train: setup
	cargo run --release -p skein -- train
test: setup
	cargo test --workspace --release
