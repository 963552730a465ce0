#!/usr/bin/env bash
# Run on a machine with a real NVIDIA GPU, from the collection root: what the driver-lifecycle
# pieces see there. Prints the next-kernel preflight's reading, and runs scv-gpu-cdi-refresh in
# check mode (it writes nothing) with its timing.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
mkdir -p "$tmp/ansible_collections/scv"
ln -s "$here" "$tmp/ansible_collections/scv/gpu"
echo "== kernel: running $(uname -r); /sys/module/nvidia/version: $(cat /sys/module/nvidia/version 2>/dev/null || echo none)"
PYTHONPATH=$tmp python3 - <<'PY'
import json, os
from ansible_collections.scv.gpu.plugins.module_utils.host.kernel import module_files, module_version, next_kernel, preflight
release, how = next_kernel("/", os.uname().release)
modules = [{"path": p, "version": module_version(p)} for p in module_files(release)] if release else []
print(json.dumps(preflight(release, how, modules, None, os.uname().release), indent=1))
PY
echo "== nvidia-smi -L"; nvidia-smi -L
echo "== scv-gpu-cdi-refresh --check, 5 runs"
for i in 1 2 3 4 5; do
  start=$(date +%s%N)
  out=$("$here/roles/container_toolkit/files/scv-gpu-cdi-refresh" --output "$tmp/cdi/nvidia.yaml" --state "$tmp/fp" --check; echo "rc=$?")
  echo "$out ($(( ($(date +%s%N) - start) / 1000000 )) ms)"
done
ls "$tmp/cdi" 2>/dev/null && echo "UNEXPECTED: --check wrote something" || echo "nothing written"
rm -rf "$tmp"
