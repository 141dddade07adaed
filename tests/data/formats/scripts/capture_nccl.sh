#!/usr/bin/env bash
# Re-captures real NCCL_DEBUG output on a machine with no GPU: libnccl.so.2 from the PyPI wheel
#   pip install --no-deps --target DIR nvidia-nccl-cu12   (2.32.3 used)
# called through ctypes by nccl_init_nogpu.py (bootstrap, then 4 ranks fail ncclCommInitRank).
# stdout+stderr as `> FILE 2>&1` writes them.
cd "$(dirname "$0")"
LIB=${LIB:?set LIB=/path/to/nvidia/nccl/lib/libnccl.so.2}
NCCL_DEBUG=INFO python nccl_init_nogpu.py "$LIB" 4 > ../nccl-debug-info-no-gpu.log 2>&1; echo rc=$?
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALL python nccl_init_nogpu.py "$LIB" 2 > ../nccl-debug-info-subsys-all-no-gpu.log 2>&1; echo rc=$?
NCCL_DEBUG=WARN python nccl_init_nogpu.py "$LIB" 2 > ../nccl-debug-warn-no-gpu.log 2>&1; echo rc=$?
