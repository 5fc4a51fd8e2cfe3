# Two entry points (see README): `make demo` and `make test`. Everything else is a step of those
# (and `make demo-local`, the demo's pipeline as local processes without a cluster).
SHELL := /bin/bash
# Build cache under the machine's home, never in the repo: a fresh clone builds warm.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/asya-rs/target
# Every clone builds its workspace crates afresh, so incremental state only piles up in the
# cache (24 GB after a day of runs here) without making a clean build faster.
export CARGO_INCREMENTAL ?= 0
export CARGO_TERM_COLOR ?= never
# The cargo profile of the tests and of the binaries they run: dev for quick iteration. `make
# test` builds everything once in `ci` (Cargo.toml: optimised, no LTO), images included;
# `make images` alone builds release images.
PROFILE ?= dev
IMAGE_PROFILE ?= release
test-steps: PROFILE = ci
test-steps: IMAGE_PROFILE = ci
# Where cargo runs. `make test` and `make demo` run under scripts/build-tree, which keeps one
# copy of the checkout per machine in step by content (ASYA_BUILD_TREE): a fresh clone then
# rebuilds only the crates whose files changed, not every workspace crate. Else the checkout.
BUILD_TREE := $(or $(ASYA_BUILD_TREE),$(CURDIR))
# Where a profile's binaries are (dev's directory is called debug); the tests read it.
bin_dir = $(CARGO_TARGET_DIR)/$(if $(filter dev,$(1)),debug,$(1))
export ASYA_CARGO_PROFILE = $(PROFILE)
export ASYA_BIN_DIR = $(call bin_dir,$(PROFILE))

.PHONY: demo demo-local test test-steps deps lint lint-static images image-tests unit services e2e validate-examples crds install-cli

# The story on the test cluster (scripts/demo-cluster.sh): deps, `make images` (ci profile),
# `make services` and the chart as tests/e2e/up installs it, then actors, envelopes, KEDA.
demo:
	./scripts/build-tree run ./scripts/demo-cluster.sh

# The same pipeline as local processes on RabbitMQ, no cluster (scripts/demo.sh): a minute.
demo-local: deps
	./scripts/demo.sh

test:
	./scripts/build-tree run $(MAKE) --no-print-directory test-steps

test-steps: deps lint-static images services unit image-tests e2e

# `make test` lints inside its own builds instead of in a pass of its own: clippy-driver as the
# workspace crates' compiler (cargo's RUSTC_WORKSPACE_WRAPPER; dependencies keep plain rustc)
# runs clippy's lints and then compiles, so the `ci` binaries and the test build check every
# workspace target `cargo clippy --all-targets` checks (no crate has benches or examples), and
# no dependency is compiled a second time in check mode (3.2 min of a cold run). Cargo rebuilds
# a crate when the wrapper or CLIPPY_ARGS change, so an artifact built without lints is never
# taken for a linted one.
test-steps: export RUSTC_WORKSPACE_WRAPPER = $(CLIPPY_DRIVER)
test-steps: export CLIPPY_ARGS = -D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
CLIPPY_DRIVER = $(shell command -v clippy-driver || echo $(HOME)/.cargo/bin/clippy-driver)

deps:
	./scripts/deps.sh

lint: lint-static
	cd $(BUILD_TREE) && cargo clippy --workspace --all-targets --locked -- -D warnings

# What lint checks without compiling (make test's builds run clippy themselves, above).
lint-static:
	cargo fmt --all -- --check
	$(HOME)/.cache/asya-rs/bin/actionlint .github/workflows/*.yml
	# One version: workspace, chart, Dockerfiles, examples' image tags, CHANGELOG.md.
	python3 scripts/check-version
	# One source for the images: the Dockerfiles are the ones deploy/images/images.toml gives.
	python3 deploy/images/dockerfiles.py --check
	# docs/ARCHITECTURE.md's test index is the one the test files' headers give.
	python3 scripts/test-index --check

# The container images, as OCI archives under target/images/ (NAME.oci.tar), built from the
# binaries of IMAGE_PROFILE and Debian's packages: no registry is needed (deploy/images/ocibuild.py).
# All the workspace's binaries in one build, as `make unit` builds them: the same features, so
# under `make test` the second build is a no-op.
images:
	cd $(BUILD_TREE) && cargo build --profile $(IMAGE_PROFILE) --locked --workspace --bins
	python3 deploy/images/ocibuild.py --bin-dir $(call bin_dir,$(IMAGE_PROFILE))

# Each image is a valid OCI image and runs under containerd + runc (tests/images); the crew's
# image stores envelopes in the S3 server of tests/services.
image-tests:
	source tests/services/env && python3 -m pytest -q -p no:cacheprovider tests/images

# Real servers the tests talk to: the test cluster (kube-apiserver and controller manager),
# which starts RabbitMQ and the SQS server first (tests/services/up).
services:
	./tests/cluster/up

# A plain `cargo test` skips the tests whose servers are not configured (tests/services/require.rs);
# here ASYA_REQUIRE_SERVICES=1 turns such a skip into a failure, so CI never passes by skipping.
# The components' unit tests also write the metrics they export (ASYA_METRICS_DUMP_DIR) for
# tests/monitoring: chart monitors, promtool on the alerts, dashboards, metrics used exist.
unit: export ASYA_METRICS_DUMP_DIR = $(CARGO_TARGET_DIR)/metrics-dump
unit:
	rm -rf $(ASYA_METRICS_DUMP_DIR)
	source tests/cluster/env && cd $(BUILD_TREE) && ASYA_REQUIRE_SERVICES=1 cargo test --profile $(PROFILE) --workspace --locked
	# The runtime's state proxy hooks run against the Rust connector: binaries and S3.
	cd $(BUILD_TREE) && cargo build --profile $(PROFILE) --workspace --locked --bins
	source tests/cluster/env && ASYA_REQUIRE_SERVICES=1 python3 -m pytest -q sidecar/runtime/tests
	ASYA_REQUIRE_SERVICES=1 python3 -m pytest -q -p no:cacheprovider tests/monitoring
	# The build tree make test builds in (scripts/build-tree).
	python3 -m pytest -q -p no:cacheprovider tests/tooling
	# The gateway end to end (MCP client, sidecars, crew, PostgreSQL, S3): needs the binaries.
	source tests/cluster/env && python3 -m pytest -q -p no:cacheprovider gateway/tests/e2e

# Under CI a skipped end-to-end test (a server, a module or a component missing) is a
# failure, as in `make unit` (tests/e2e/conftest.py); `tests/e2e/run` alone keeps the skips.
e2e:
	ASYA_REQUIRE_SERVICES=1 ./tests/e2e/run

validate-examples:
	cargo run -q -p asya-webhook --bin asya-webhook -- validate -f deploy/examples/

# The `asya` command line (cli/README.md): `asya` and `kubectl-asya` into ~/.cargo/bin.
install-cli:
	cargo install --locked --path cli

# Regenerates deploy/crds from the Rust types (a test fails when they differ).
crds:
	cargo run -q -p asya-api --bin asya-crdgen -- deploy/crds
