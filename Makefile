# bundlevisor — `make help` lists the targets.
SHELL := /bin/bash
CARGO ?= cargo
CONFIG ?= config/bundlevisor.toml
DEMO_BIN := bundles/demo/server/bundlevisor-demo

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

.PHONY: build
build: ## Build the release binaries and place the demo bundle's server
	$(CARGO) build --release --bins
	install -D -m 0755 target/release/bundlevisor-demo $(DEMO_BIN)

.PHONY: run
run: build ## Build, then run the daemon on config/bundlevisor.toml (bundles/ is installed)
	target/release/bundlevisor daemon --config $(CONFIG)

.PHONY: test
test: ## Everything CI runs: unit and integration tests (with fault injection)
	$(CARGO) test --all-targets --features fault-injection

.PHONY: bench
bench: build ## Measure install latency and daemon memory (docs/performance.md)
	bench/foundation.sh

.PHONY: lint
lint: ## rustfmt check and clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets --all-features -- -D warnings

.PHONY: fmt
fmt: ## Format the code
	$(CARGO) fmt --all

.PHONY: clean
clean: ## Remove build output and the local state of `make run`
	$(CARGO) clean
	rm -rf .bundlevisor $(DEMO_BIN)
