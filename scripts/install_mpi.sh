#!/usr/bin/env bash
# Make sure an MPI (mpirun + mpicc) is available. Shared by `make setup` and docker/Dockerfile.
# Order: an MPI already on PATH (e.g. `module load openmpi`) wins; else, as root, Debian's OpenMPI;
# else stop and say what to install.
set -euo pipefail

if command -v mpirun >/dev/null 2>&1 && command -v mpicc >/dev/null 2>&1; then
    echo "[mpi] using $(command -v mpirun) ($(mpirun --version 2>/dev/null | head -n1))"
    exit 0
fi

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    # Two setups at once (two checkouts on a new machine): the second waits for the first's install and uses it.
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$([ -d /run/lock ] && echo /run/lock || echo /tmp)/horovod-train-install-mpi.lock"
        flock 9
        if command -v mpirun >/dev/null 2>&1 && command -v mpicc >/dev/null 2>&1; then
            echo "[mpi] using $(command -v mpirun), installed meanwhile"
            exit 0
        fi
    fi
    echo "[mpi] installing OpenMPI from Debian (openmpi-bin libopenmpi-dev)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev >/dev/null
    echo "[mpi] installed $(mpirun --version 2>/dev/null | head -n1)"
    exit 0
fi

echo "error: no MPI found (mpirun/mpicc not on PATH); fix: 'module load openmpi' on a cluster, or as root 'apt-get install openmpi-bin libopenmpi-dev'" >&2
exit 2
