# scv.gpu: every target installs what it needs; see README.md.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

ROOT := $(CURDIR)
BUILD := $(ROOT)/build

# The newest Python >= 3.11 decides the ansible-core line: 3.12+ gets 2.21, 3.11 gets 2.19.
PYTHON := $(shell tools/find-python)
PY_MINOR := $(shell $(PYTHON) -c 'import sys; print(sys.version_info[1])')
ifeq ($(PY_MINOR),11)
REQUIREMENTS := tests/requirements/dev-py311.txt
COMPAT_PYTHON :=
else
REQUIREMENTS := tests/requirements/dev.txt
# A second environment on ansible-core 2.19 (the oldest we support), where Python 3.11 exists.
COMPAT_PYTHON := $(shell tools/find-python 3.11 2>/dev/null)
endif
VENV := $(ROOT)/.venv
COMPAT_VENV := $(ROOT)/.venv-ansible-2.19
VENV_STAMP := $(VENV)/.requirements
COMPAT_STAMP := $(if $(COMPAT_PYTHON),$(COMPAT_VENV)/.requirements)

COLLECTIONS := $(BUILD)/collections
COLLECTION_LINK := $(COLLECTIONS)/ansible_collections/scv/gpu
SIM_DIR := $(BUILD)/nvml-simulator
SIM := $(SIM_DIR)/libnvidia-ml.so.1
SCENARIOS := $(ROOT)/tests/nvml_simulator/scenarios
DEMO_SCENARIO ?= $(SCENARIOS)/h100_sxm_x8.json
CLUSTER_DIR := $(BUILD)/cluster

export ANSIBLE_COLLECTIONS_PATH := $(COLLECTIONS)
export ANSIBLE_NOCOWS := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help
help:
	@echo "make demo         site.yml on localhost (simulated GPUs, host stages in check mode) against a local API server"
	@echo "make demo-pod     a pod given a GPU through NVIDIA's container runtime on a real kubelet (root)"
	@echo "make test         sanity, lint, unit, integration and molecule tests (what CI runs; times in build/stage-times.txt)"
	@echo "make test-fresh   .ci/run on a clean clone with every cache moved aside, as on a fresh machine (root)"
	@echo "make molecule     the molecule scenarios in podman systemd containers (root)"
	@echo "make sanity       ansible-test sanity, offline"
	@echo "make lint         ansible-lint, production profile"
	@echo "make unit         pytest tests/unit"
	@echo "make integration  pytest tests/integration on the newest ansible-core line, then its every_ansible_line tests on 2.19"
	@echo "make cluster      start a local kube-apiserver + etcd (admin kubeconfig in build/cluster)"
	@echo "make cluster-stop stop it"
	@echo "make benchmark    benchmarks/*.py (figures for docs/benchmarks.md)"
	@echo "make clean        remove build/ (make distclean: the virtual environments too)"

# ---------------------------------------------------------------- environments

$(VENV_STAMP): $(REQUIREMENTS)
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -r $(REQUIREMENTS)
	cp $(REQUIREMENTS) $@

$(COMPAT_VENV)/.requirements: tests/requirements/dev-py311.txt
	rm -rf $(COMPAT_VENV)
	$(COMPAT_PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install -q --upgrade pip
	$(COMPAT_VENV)/bin/python -m pip install -q -r $<
	cp $< $@

.PHONY: venv
venv: $(VENV_STAMP)

$(COLLECTION_LINK):
	mkdir -p $(dir $@)
	ln -sfn $(ROOT) $@

.PHONY: collection
collection: $(COLLECTION_LINK)

# The NVML simulator, compiled against the real nvml.h from nvidia-nvml-dev.
$(SIM): tests/nvml_simulator/nvml_simulator.c $(wildcard tests/fixtures/nvml-symbols/*.txt) tools/build-simulator $(VENV_STAMP)
	tools/build-simulator $(VENV) $@

.PHONY: simulator
simulator: $(SIM)

# kube-apiserver, kubectl and etcd from the pinned Go module, built once into ~/.cache/scv-gpu.
.PHONY: control-plane
control-plane:
	tools/control-plane/build

# The test control plane's command line (tests/harness/control_plane.py).
CONTROL_PLANE := PYTHONPATH=$(ROOT)/tests $(VENV)/bin/python -m harness.control_plane

.PHONY: cluster cluster-stop
cluster: $(VENV_STAMP) control-plane
	$(CONTROL_PLANE) start $(CLUSTER_DIR)
cluster-stop: $(VENV_STAMP)
	$(CONTROL_PLANE) stop $(CLUSTER_DIR)

# ---------------------------------------------------------------------- demo

.PHONY: demo
demo: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM) control-plane
	tools/demo $(DEMO_SCENARIO)

# A pod given a GPU on a real kubelet, through NVIDIA's own container runtime (root).
.PHONY: demo-pod
demo-pod: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM)
	tools/control-plane/build --kubelet --scheduler --controller-manager >/dev/null
	PYTHONPATH=$(ROOT)/tests:$(COLLECTIONS) LD_LIBRARY_PATH=$(SIM_DIR) $(VENV)/bin/python -m harness.demo_pod

# --------------------------------------------------------------------- tests

# Sanity, lint and unit while the Go builds and the molecule host are prepared in the background,
# then integration and molecule; fails fast, and writes each stage's time to build/stage-times.txt.
.PHONY: test
test:
	tools/test

# .ci/run on a clean clone of HEAD with every cache (control plane, venvs, pip, Go, ansible-test,
# the podman image) moved aside and put back afterwards: what a fresh CI machine does.
.PHONY: test-fresh
test-fresh:
	tools/test-fresh

# What lint, unit and integration all need, made once before they start side by side (tools/test).
.PHONY: prerequisites
prerequisites: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM)

.PHONY: sanity
sanity: $(VENV_STAMP)
	tools/sanity $(VENV) $(PYTHON)

.PHONY: lint
# ansible-lint installs this collection into ~/.ansible/collections and keeps that copy while
# the version in galaxy.yml stays the same; remove it so that lint sees the working tree.
lint: $(VENV_STAMP) $(COLLECTION_LINK)
	rm -rf $(HOME)/.ansible/collections/ansible_collections/scv/gpu
	PATH=$(VENV)/bin:$$PATH $(VENV)/bin/ansible-lint --offline
	$(VENV)/bin/antsibull-changelog lint

.PHONY: unit
unit: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM)
	LD_LIBRARY_PATH=$(SIM_DIR) $(VENV)/bin/python -m pytest tests/unit

.PHONY: integration
integration: $(VENV_STAMP) $(COMPAT_STAMP) $(COLLECTION_LINK) $(SIM) control-plane agent-wheels
	SCV_GPU_WHEELS=$(AGENT_WHEELS) tools/integration $(VENV) $(if $(COMPAT_PYTHON),$(COMPAT_VENV))

# Molecule scenarios in podman systemd containers (root).
MOLECULE_SCENARIOS := default container_toolkit_docker container_toolkit_containerd container_toolkit_containerd2 \
	nvidia_driver_host nvidia_driver_trixie nvidia_driver_secure_boot scv_agent
.PHONY: molecule
molecule: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM) control-plane agent-wheels
	tools/molecule $(MOLECULE_SCENARIOS)

# The Scv agent's pinned packages (roles/scv_agent/files/requirements.txt) as wheels for Debian 12's
# Python 3.11: the molecule scenario, the integration tests and the agent benchmarks install from here.
AGENT_WHEELS := $(BUILD)/agent-wheels
.PHONY: agent-wheels
agent-wheels: $(VENV_STAMP)
	tools/agent-wheels $(VENV) $(AGENT_WHEELS)

# ----------------------------------------------------------------- benchmark

# Benchmarks import the test harness and the collection by name.
BENCHMARK_PYTHON := PYTHONPATH=$(ROOT)/tests:$(COLLECTIONS) $(VENV)/bin/python
.PHONY: benchmark benchmark-gpu-facts benchmark-scv benchmark-agent benchmark-pod-resources benchmark-fleet \
	benchmark-site-fleet benchmark-go-build
benchmark: benchmark-gpu-facts benchmark-scv benchmark-agent benchmark-pod-resources benchmark-fleet \
	benchmark-site-fleet benchmark-go-build
benchmark-gpu-facts: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM)
	LD_LIBRARY_PATH=$(SIM_DIR) $(BENCHMARK_PYTHON) benchmarks/gpu_facts.py
benchmark-scv: $(VENV_STAMP) $(COLLECTION_LINK) control-plane
	$(BENCHMARK_PYTHON) benchmarks/scv_publish.py
benchmark-agent: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM) control-plane agent-wheels
	$(BENCHMARK_PYTHON) benchmarks/scv_agent.py --wheels $(AGENT_WHEELS)
benchmark-pod-resources: $(VENV_STAMP) $(COLLECTION_LINK)
	$(BENCHMARK_PYTHON) benchmarks/pod_resources.py
# 50, 100 and 200 agents against one API server (about 30 minutes on 2 cores); FLEET_SIZES=10 for a short run.
FLEET_SIZES ?= 50,100,200
benchmark-fleet: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM) control-plane agent-wheels
	$(BENCHMARK_PYTHON) benchmarks/fleet.py --wheels $(AGENT_WHEELS) --sizes $(FLEET_SIZES)
# site.yml over an inventory of 100 local hosts with forks 10 and 50 (about 30 minutes on 2 cores).
benchmark-site-fleet: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM) control-plane
	$(BENCHMARK_PYTHON) benchmarks/site_fleet.py
# kube-apiserver, kubectl and etcd from an empty build cache, with Go's GC setting and tools/lib/go.sh's
# (about 10 minutes a run on 2 cores); GO_BUILD_RUNS=3 alternates the order.
GO_BUILD_RUNS ?= 1
benchmark-go-build: $(VENV_STAMP)
	$(BENCHMARK_PYTHON) benchmarks/go_build.py --runs $(GO_BUILD_RUNS)

.PHONY: clean distclean
clean:
	rm -rf $(BUILD) tests/output
distclean: clean
	rm -rf $(VENV) $(COMPAT_VENV)
