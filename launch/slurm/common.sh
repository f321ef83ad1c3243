# shellcheck shell=bash
# Shared by the launch/slurm/*.sbatch scripts (sourced after they found the checkout; see there).
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# hvt_slurm_job: check we run inside an allocation; sets HVT_NODES (the allocated host names, one per
# line) and HVT_TASKS_PER_NODE (one task per GPU: --ntasks-per-node, --gres=gpu:N on GPU clusters).
hvt_slurm_job() {
    [ -n "${SLURM_JOB_ID:-}" ] || hvt_die "not inside a SLURM job" \
        "submit it: sbatch [options] $0 [training args], or launch/slurm/submit.sh"
    hvt_need_command scontrol "run this on a SLURM cluster node (scontrol, srun)"
    hvt_need_command srun "run this on a SLURM cluster node (scontrol, srun)"
    HVT_NODES=$(scontrol show hostnames "${SLURM_JOB_NODELIST:?}")
    local nnodes=${SLURM_NNODES:-1}
    HVT_TASKS_PER_NODE=${SLURM_NTASKS_PER_NODE:-$((${SLURM_NTASKS:-$nnodes} / nnodes))}
    hvt_positive_int --ntasks-per-node "$HVT_TASKS_PER_NODE"
    echo "[slurm] job $SLURM_JOB_ID: $nnodes node(s) ($(echo "$HVT_NODES" | paste -sd, -))," \
        "$HVT_TASKS_PER_NODE task(s) per node, GPUs: ${SLURM_JOB_GPUS:-${SLURM_GPUS_ON_NODE:-none}}"
}

# hvt_srun_mpi: the srun --mpi plugin for MPI ranks (HVT_SRUN_MPI, default pmix), checked against
# what this Slurm offers (`srun --mpi=list`). Sets HVT_MPI.
hvt_srun_mpi() {
    HVT_MPI=${HVT_SRUN_MPI:-pmix}
    if ! srun --mpi=list 2>&1 | grep -Eq "^[[:space:]]*${HVT_MPI}([[:space:]]|$)"; then
        hvt_die "this Slurm has no srun --mpi=$HVT_MPI plugin (srun --mpi=list)" \
            "set HVT_SRUN_MPI=pmi2, or use launch/slurm/horovod_mpirun.sbatch"
    fi
}
