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
DEMO_CLUSTER_DIR := $(BUILD)/demo-cluster

export ANSIBLE_COLLECTIONS_PATH := $(COLLECTIONS)
export ANSIBLE_NOCOWS := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help
help:
	@echo "make demo         site.yml on localhost (simulated GPUs, host stages in check mode) against a local API server"
	@echo "make test         sanity, lint, unit, integration and molecule tests (what CI runs)"
	@echo "make test-fresh   .ci/run on a clean clone with every cache moved aside, as on a fresh machine (root)"
	@echo "make molecule     the molecule scenarios in podman systemd containers (root)"
	@echo "make sanity       ansible-test sanity, offline"
	@echo "make lint         ansible-lint, production profile"
	@echo "make unit         pytest tests/unit"
	@echo "make integration  pytest tests/integration, on every ansible-core line available"
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
$(SIM): tests/nvml_simulator/nvml_simulator.c $(VENV_STAMP)
	mkdir -p $(SIM_DIR)
	header=$$(find $(VENV)/lib -path '*/nvidia/*/include/nvml.h' | head -n 1); \
	test -n "$$header" || { echo "nvml.h not found in $(VENV): is nvidia-nvml-dev installed?" >&2; exit 1; }; \
	gcc -std=c11 -D_GNU_SOURCE -O2 -fPIC -shared -fvisibility=hidden -Wall -Wextra -Werror \
	    -I"$$(dirname "$$header")" -Wl,-soname,libnvidia-ml.so.1 -o $@ $< -lpthread

.PHONY: simulator
simulator: $(SIM)

# kube-apiserver, kubectl and etcd from the pinned Go module, built once into ~/.cache/scv-gpu.
.PHONY: control-plane
control-plane:
	tools/control-plane/build

.PHONY: cluster cluster-stop
cluster: $(VENV_STAMP) control-plane
	$(VENV)/bin/python tests/control_plane.py start $(CLUSTER_DIR)
cluster-stop: $(VENV_STAMP)
	$(VENV)/bin/python tests/control_plane.py stop $(CLUSTER_DIR)

# ---------------------------------------------------------------------- demo

.PHONY: demo
demo: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM) control-plane
	@echo "Simulated GPUs from $(DEMO_SCENARIO) (set DEMO_SCENARIO=... for another node)"
	$(VENV)/bin/python tests/control_plane.py stop $(DEMO_CLUSTER_DIR) >/dev/null
	$(VENV)/bin/python tests/control_plane.py start $(DEMO_CLUSTER_DIR)
	trap '$(VENV)/bin/python tests/control_plane.py stop $(DEMO_CLUSTER_DIR)' EXIT; \
	export LD_LIBRARY_PATH=$(SIM_DIR) NVMLSIM_CONFIG=$(DEMO_SCENARIO); \
	kubectl="$$(tools/control-plane/build)/kubectl --kubeconfig $(DEMO_CLUSTER_DIR)/admin.kubeconfig"; \
	echo '{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "demo-node"}}' | $$kubectl create -f - && \
	site="$(VENV)/bin/ansible-playbook -i playbooks/inventory/demo.yml -e ansible_python_interpreter=$(VENV)/bin/python \
	  -e scv_gpu_kubeconfig=$(DEMO_CLUSTER_DIR)/admin.kubeconfig playbooks/site.yml"; \
	echo '# site.yml, host stages in check mode: nothing on this machine changes' && \
	$$site --tags host_roles --check && \
	echo '# site.yml, the API-side stages against the local control plane' && \
	$$site --skip-tags host_roles && \
	echo && echo '$$ kubectl get scv' && $$kubectl get scv && \
	echo && echo '$$ kubectl get node demo-node --show-labels' && \
	$$kubectl get node demo-node -o go-template='{{range $$k, $$v := .metadata.labels}}{{$$k}}={{$$v}}{{"\n"}}{{end}}' && \
	echo && echo '$$ kubectl -n kube-system get daemonset' && $$kubectl -n kube-system get daemonset

# --------------------------------------------------------------------- tests

.PHONY: test
# What the later stages need and sanity, lint and unit do not takes minutes on a fresh machine:
# the Go builds (control plane and kubelet, containerd 2, dockerd) and the molecule host (podman, the Debian image).
# Both run in the background meanwhile, their output in build/*.log; integration starts once
# they are done.
test:
	mkdir -p $(BUILD)
	( tools/control-plane/build --kubelet && tools/containerd/build && tools/dockerd/build ) > $(BUILD)/go-builds.log 2>&1 & builds=$$!; \
	tests/molecule/prepare-host > $(BUILD)/prepare-host.log 2>&1 & host=$$!; \
	status=0; $(MAKE) sanity lint unit || status=$$?; \
	if [ $$status -ne 0 ]; then kill $$builds $$host 2>/dev/null || true; wait 2>/dev/null || true; exit $$status; fi; \
	wait $$builds || { echo "make test: the Go builds failed:" >&2; cat $(BUILD)/go-builds.log >&2; exit 1; }; \
	wait $$host || { echo "make test: preparing the molecule host failed:" >&2; cat $(BUILD)/prepare-host.log >&2; exit 1; }; \
	grep -h "built in" $(BUILD)/go-builds.log || true
	$(MAKE) integration molecule

# .ci/run on a clean clone of HEAD with every cache (control plane, venvs, pip, Go, ansible-test,
# the podman image) moved aside and put back afterwards: what a fresh CI machine does.
.PHONY: test-fresh
test-fresh:
	tools/test-fresh

# ansible-test must run from ansible_collections/<namespace>/<name> and, to set
# up its virtual environments, wants a pip bootstrap script it would download;
# tools/ansible-test-get-pip.py stands in for it so sanity never leaves PyPI.
SANITY_ROOT := $(BUILD)/sanity/ansible_collections/scv/gpu
.PHONY: sanity
sanity: $(VENV_STAMP)
	pip_version=$$($(VENV)/bin/python -c 'import re, ansible_test, pathlib; \
	  src = pathlib.Path(ansible_test.__file__).parent.joinpath("_internal/python_requirements.py").read_text(); \
	  print(re.search(r"pip=.([0-9.]+).", src).group(1))'); \
	mkdir -p ~/.ansible/test/cache; \
	cp tools/ansible-test-get-pip.py ~/.ansible/test/cache/get_pip_$${pip_version//./_}.py
	rm -rf $(BUILD)/sanity && mkdir -p $(SANITY_ROOT) $(BUILD)/sanity/ansible_collections/kubernetes
	git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t $(SANITY_ROOT)
	# the scv module's docs and imports come from kubernetes.core, which ansible-test finds beside us
	cp -r $$($(VENV)/bin/python -c 'import ansible_collections.kubernetes.core as c; print(list(c.__path__)[0])') \
	  $(BUILD)/sanity/ansible_collections/kubernetes/
	cd $(SANITY_ROOT) && git init -q && git add -A && \
	  PATH=$(dir $(PYTHON)):$$PATH $(VENV)/bin/ansible-test sanity --venv --python $$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])') --color no

.PHONY: lint
# ansible-lint installs this collection into ~/.ansible/collections and keeps that copy while
# the version in galaxy.yml stays the same; remove it so that lint sees the working tree.
lint: $(VENV_STAMP) $(COLLECTION_LINK)
	rm -rf $(HOME)/.ansible/collections/ansible_collections/scv/gpu
	PATH=$(VENV)/bin:$$PATH $(VENV)/bin/ansible-lint --offline

.PHONY: unit
unit: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM)
	LD_LIBRARY_PATH=$(SIM_DIR) $(VENV)/bin/python -m pytest tests/unit

.PHONY: integration
integration: $(VENV_STAMP) $(COMPAT_STAMP) $(COLLECTION_LINK) $(SIM) control-plane agent-wheels
	SCV_GPU_ANSIBLE_VENVS="$(VENV)$(if $(COMPAT_PYTHON), $(COMPAT_VENV))" SCV_GPU_WHEELS=$(AGENT_WHEELS) \
	  $(VENV)/bin/python -m pytest tests/integration --durations=20

# Molecule scenarios in podman systemd containers; prepare-host installs podman and builds
# the Debian image once, build-apt-repo the signed stand-in toolkit repository.
APT_REPO := $(BUILD)/apt-repo
MOLECULE_SCENARIOS := default container_toolkit_docker container_toolkit_containerd container_toolkit_containerd2 nvidia_driver_host nvidia_driver_secure_boot scv_agent
DRIVER_REPO := $(BUILD)/driver-repo
MOLECULE_CLUSTER_DIR := $(BUILD)/molecule-cluster
.PHONY: molecule
molecule: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM) control-plane agent-wheels
	tests/molecule/prepare-host
	tests/molecule/build-apt-repo $(APT_REPO)
	header=$$(find $(VENV)/lib -path '*/nvidia/*/include/nvml.h' | head -n 1); \
	  tests/molecule/build-driver-repo $(DRIVER_REPO) "$$(dirname "$$header")"
	$(VENV)/bin/python tests/control_plane.py stop $(MOLECULE_CLUSTER_DIR) >/dev/null
	$(VENV)/bin/python tests/control_plane.py start $(MOLECULE_CLUSTER_DIR)
	trap '$(VENV)/bin/python tests/control_plane.py stop $(MOLECULE_CLUSTER_DIR)' EXIT; \
	containerd2=$$(tools/containerd/build); export SCV_GPU_CONTAINERD2_DIR=$$containerd2; \
	export SCV_GPU_APT_REPO=$(APT_REPO) SCV_GPU_DRIVER_REPO=$(DRIVER_REPO) SCV_GPU_COLLECTIONS=$(COLLECTIONS) \
	  SCV_GPU_CLUSTER_DIR=$(MOLECULE_CLUSTER_DIR) SCV_GPU_SIMULATOR_DIR=$(SIM_DIR) \
	  SCV_GPU_SCENARIOS=$(CURDIR)/tests/nvml_simulator/scenarios SCV_GPU_WHEELS=$(AGENT_WHEELS) \
  SCV_GPU_PYTHON=$(VENV)/bin/python \
	  PATH=$(VENV)/bin:$$PATH; \
	export SCV_GPU_AGENT_KUBECONFIG=$$($(VENV)/bin/python tests/control_plane.py node-kubeconfig $(MOLECULE_CLUSTER_DIR) scv-agent-node); \
	for scenario in $(MOLECULE_SCENARIOS); do \
	  $(VENV)/bin/molecule test -s $$scenario || exit 1; \
	done

# The Scv agent's Python packages as wheels for Debian 12's Python 3.11: the molecule scenario and
# the agent benchmark install from this folder, as an air-gapped site would.
AGENT_WHEELS := $(BUILD)/agent-wheels
.PHONY: agent-wheels
agent-wheels: $(VENV_STAMP)
	$(VENV)/bin/pip download --quiet --dest $(AGENT_WHEELS) --only-binary=:all: --python-version 3.11 \
	  --platform manylinux_2_17_$$(uname -m) --platform manylinux2014_$$(uname -m) \
	  $$(sed -n '/^scv_agent_python_packages:/,/^[^ ]/s/^  - //p' roles/scv_agent/defaults/main.yml)

# ----------------------------------------------------------------- benchmark

.PHONY: benchmark benchmark-gpu-facts benchmark-scv benchmark-agent benchmark-pod-resources benchmark-fleet \
	benchmark-site-fleet
benchmark: benchmark-gpu-facts benchmark-scv benchmark-agent benchmark-pod-resources benchmark-fleet \
	benchmark-site-fleet
benchmark-gpu-facts: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM)
	LD_LIBRARY_PATH=$(SIM_DIR) $(VENV)/bin/python benchmarks/gpu_facts.py
benchmark-scv: $(VENV_STAMP) $(COLLECTION_LINK) control-plane
	$(VENV)/bin/python benchmarks/scv_publish.py
benchmark-agent: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM) control-plane agent-wheels
	$(VENV)/bin/python benchmarks/scv_agent.py --wheels $(AGENT_WHEELS)
benchmark-pod-resources: $(VENV_STAMP) $(COLLECTION_LINK)
	$(VENV)/bin/python benchmarks/pod_resources.py
# 50, 100 and 200 agents against one API server (about 30 minutes on 2 cores); FLEET_SIZES=10 for a short run.
FLEET_SIZES ?= 50,100,200
benchmark-fleet: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM) control-plane agent-wheels
	$(VENV)/bin/python benchmarks/fleet.py --wheels $(AGENT_WHEELS) --sizes $(FLEET_SIZES)
# site.yml over an inventory of 100 local hosts with forks 10 and 50 (about 30 minutes on 2 cores).
benchmark-site-fleet: $(VENV_STAMP) $(COLLECTION_LINK) $(SIM) control-plane
	$(VENV)/bin/python benchmarks/site_fleet.py

.PHONY: clean distclean
clean:
	rm -rf $(BUILD) tests/output
distclean: clean
	rm -rf $(VENV) $(COMPAT_VENV)
