# nodelb — `make demo` runs the lab demo, `make test` runs every test tier.
# Both set up what they need first (Debian packages, the virtualenv, the Kubernetes binaries,
# the node runtime);
# every set-up step is idempotent and quick when already done.
SHELL := /bin/bash
include versions.env
include versions-promtool.env
include versions-helm.env

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
CACHE ?= $(or $(NODELB_CACHE),$(HOME)/.cache/nodelb)
# The build scripts and lab/binaries.py find the cache through this.
export NODELB_CACHE := $(CACHE)
KUBE_BIN := $(CACHE)/k8s/$(KUBE_VERSION)
ETCD_BIN := $(CACHE)/etcd/$(ETCD_VERSION)
export NODELB_KUBE_BIN := $(KUBE_BIN)
export NODELB_ETCD_BIN := $(ETCD_BIN)
export PROMTOOL := $(CACHE)/promtool/$(PROMTOOL_VERSION)/promtool
export HELM := $(CACHE)/helm/$(HELM_VERSION)/helm

APT_PACKAGES := nftables libnftables1 python3-nftables iproute2 keepalived conntrack tcpdump \
	socat iputils-ping arping ndisc6 openssl shellcheck procps

# The node runtime (scripts/build-runtime.sh): runc links libseccomp, found through pkg-config;
# the kubelets' pods get their network from the CNI plugins in /usr/lib/cni.
APT_PACKAGES += libseccomp-dev pkg-config containernetworking-plugins

.PHONY: test demo setup deps venv kube runtime promtool helm lint typecheck unit kernel e2e bench clean

test: setup conformance-build lint typecheck
	$(VPY) -m pytest tests

demo: setup
	@# builds the persistent lab (replacing a previous one) and leaves it up: `nodelb lab down`
	$(VENV)/bin/nodelb lab demo

setup: deps venv kube runtime promtool helm images

# Debian packages: install only when one is missing, so a warm run does no apt work.
deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@# vagrant (brings ruby) for tests/unit/test_vagrant.py, without its recommends
	@# (vagrant-libvirt, qemu, libvirt: ~400 packages); the test validates with --ignore-provider.
	@dpkg-query -W -f='$${Status}\n' vagrant 2>/dev/null | grep -q '^install ok installed' || { \
	  echo "installing Debian packages: vagrant (no recommends)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends vagrant; }

venv: $(VENV)/.stamp

# The nftables bindings are Debian's (pure Python over libnftables1 via ctypes, not on PyPI):
# link just that package into the virtualenv instead of exposing all system site-packages.
$(VENV)/.stamp: pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev]'
	ln -sfn /usr/lib/python3/dist-packages/nftables \
	  "$$($(VPY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nftables"
	$(VPY) -c 'import nftables, pyroute2, kubernetes, orjson, prometheus_client'
	touch $@

kube:
	./scripts/build-kube.sh >/dev/null

# containerd, runc and pause for the lab nodes' kubelets (needs the deps above for runc)
runtime:
	./scripts/build-runtime.sh >/dev/null

promtool:
	./scripts/build-promtool.sh >/dev/null

# helm for the chart's checks (deploy/helm/nodelb; tests/unit/test_chart.py, tests/e2e/test_chart.py)
helm:
	./scripts/build-helm.sh >/dev/null

# The upstream e2e suite, e2e.test, and the ginkgo CLI at KUBE_VERSION, for the
# [Feature:LoadBalancer] specs (issue #14); then a ginkgo dry run (no cluster, no server) checks
# that conformance/specs.txt is what the suite selects and that conformance/skip.txt skips
# exactly its specs. Not part of setup: the largest build of all (7 min 47 s cold, 2.95 GB
# peak RSS), and only the conformance run needs it.
.PHONY: conformance-build conformance
conformance-build: venv
	./scripts/build-kube.sh conformance >/dev/null
	$(VPY) -m lab.conformance check

# Every [Feature:LoadBalancer] spec (skip.txt's skipped) from the outside network of a new
# real-node lab, nodelb installed from deploy/; records the per-spec table in
# docs/conformance.md and fails unless every spec that is not skipped passed.
# (The runner checks the lists itself: conformance-build's check would run the dry runs twice.)
conformance: setup
	./scripts/build-kube.sh conformance >/dev/null
	$(VPY) -m lab.conformance_run --record docs/conformance.md

# The OCI archives the lab's nodes import into containerd (nodelb's image from deploy/, the e2e
# pause and agnhost images); cached, so a warm run only hashes the inputs. mmdebstrap makes
# their Debian base, buildah builds and exports them. Not part of setup.
APT_PACKAGES += mmdebstrap buildah
.PHONY: images
images: deps kube runtime
	./scripts/build-images.sh >/dev/null

lint: venv
	$(VENV)/bin/ruff check agent rules lab tests bench
	$(VENV)/bin/ruff format --check agent rules lab tests bench
	$(VENV)/bin/hadolint deploy/Containerfile lab/images/*/Containerfile
	$(VENV)/bin/lint-imports --no-cache

typecheck: venv
	$(VENV)/bin/mypy

unit: venv promtool helm
	$(VPY) -m pytest tests/unit

kernel: setup
	$(VPY) -m pytest tests/kernel

e2e: setup
	$(VPY) -m pytest tests/e2e

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
