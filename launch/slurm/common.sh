# shellcheck shell=bash
# Shared by the launch/slurm/*.sbatch scripts (sourced after they found the checkout; see there).
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
# shellcheck source=launch/ranks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../ranks.sh"

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

# hvt_rank_variables: horovod_train/launching/'s rank variable names, '|'-separated (a process with one of
# them may be a training rank).
hvt_rank_variables() {
    PYTHONPATH="$HVT_REPO${PYTHONPATH:+:$PYTHONPATH}" "${HVT_PY:-python3}" -m horovod_train.launching \
        rank-variables signalled
}

# Stopping at a time limit or preemption without losing work. The #SBATCH lines of the jobs ask SLURM
# to send the batch shell SIGUSR1 HVT_SIGNAL_LEAD seconds before the end (--signal=B:USR1@...) and to
# allow requeueing (--requeue). On that signal the batch shell passes SIGUSR1 to the training ranks of
# this job on every node (never to a launcher: torchrun's agent, horovodrun and mpirun would die of it
# or kill the ranks); they agree at the next step, rank 0 writes a checkpoint and every rank exits
# with code 75. Then the job requeues itself, and the requeued run resumes with
# --resume_from_checkpoint auto.

# hvt_slurm_command ARGS...: hvt_command, plus --resume_from_checkpoint auto when SLURM restarted the
# job (SLURM_RESTART_COUNT > 0) and the training arguments name no checkpoint themselves.
hvt_slurm_command() {
    hvt_command "$@"
    if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && [ "${HVT_CMD[0]}" = train ] &&
        ! printf '%s\n' "${HVT_CMD[@]}" | grep -q '^--resume_from_checkpoint'; then
        HVT_CMD+=(--resume_from_checkpoint auto)
        echo "[slurm] restart ${SLURM_RESTART_COUNT} of job $SLURM_JOB_ID: resuming from the newest valid checkpoint"
    fi
}

# hvt_signal_local_ranks SIGNAL JOB_ID [RANK_VARS]: signal this node's training ranks of the job (launch/ranks.sh:
# Python processes that catch SIGUSR1, neither torchrun's agent nor the parent of another) among the processes
# whose environment holds the job id and a rank variable (RANK_VARS, '|'-separated; by default
# hvt_rank_variables's). Under MpiDefault=pmix or pmi2 srun gives every task PMIX_RANK/PMI_RANK, launchers
# included: torchrun's agent (SIGUSR1 kills it while its workers checkpoint) and apptainer; ranks.sh's rules leave
# them out. All of them with one kill: signalled one by one, the first ranks could stop (and exit) before the last
# is found. Self-contained: hvt_stop_command ships it to every node with `declare -f`, with ranks.sh's functions.
hvt_signal_local_ranks() {
    local job_id=$2 rank_vars=${3:-}
    local -a ranks
    [ -n "$rank_vars" ] || rank_vars=$(hvt_rank_variables)
    mapfile -t ranks < <(hvt_training_ranks hvt_job_rank_process)
    [ "${#ranks[@]}" -gt 0 ] || return 0
    kill -"$1" "${ranks[@]}" 2>/dev/null
    echo "[slurm] SIG$1 -> rank processes ${ranks[*]} on $(hostname)"
}

# hvt_job_rank_process PID: whether PID's environment holds the job's id and a rank variable (job_id and rank_vars:
# hvt_signal_local_ranks's).
hvt_job_rank_process() {
    local environ
    environ=$(tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null) || return 1
    grep -qx "SLURM_JOB_ID=$job_id" <<<"$environ" && grep -qE "^($rank_vars)=" <<<"$environ"
}

# hvt_stop_command: sets HVT_STOP_CMD, the command that runs hvt_signal_local_ranks SIGNAL on each node of the
# job (srun --overlap, one task per node), SIGNAL left as "$1" for `bash -c`. Built before the run starts, so that
# the trap only runs it.
hvt_stop_command() {
    local ranks functions
    ranks=$(hvt_rank_variables)
    functions=$(declare -f hvt_signal_local_ranks hvt_job_rank_process "${HVT_RANK_FUNCTIONS[@]}")
    hvt_launch_command srun --overlap --nodes "${SLURM_NNODES:-1}" --ntasks "${SLURM_NNODES:-1}" \
        --ntasks-per-node 1 -- bash -c "$functions
hvt_signal_local_ranks \"\$1\" $SLURM_JOB_ID '$ranks'" hvt-stop
    HVT_STOP_CMD=("${HVT_LAUNCH[@]}")
}

# hvt_forward_stop SIGNAL: the batch shell's trap. One task on each node of the job signals its ranks.
hvt_forward_stop() {
    HVT_STOP_SIGNAL=$1
    echo "[slurm] batch shell got SIG$1: asking the ranks to checkpoint and stop"
    "${HVT_STOP_CMD[@]}" "$1" || echo "[slurm] could not reach every node to signal its ranks" >&2
}

# hvt_slurm_run CMD...: print the effective command, run it with the stop signal trapped; after a stop,
# requeue the job (scontrol requeue) so that it continues from its checkpoint.
hvt_slurm_run() {
    local status
    HVT_STOP_SIGNAL=""
    hvt_stop_command
    trap 'hvt_forward_stop USR1' USR1
    hvt_print_command "$@"
    "$@" &
    HVT_LAUNCHER_PID=$!
    # `wait` returns early (status > 128) each time a trapped signal arrives: wait until the launcher ends.
    while true; do
        wait "$HVT_LAUNCHER_PID" && status=0 || status=$?
        kill -0 "$HVT_LAUNCHER_PID" 2>/dev/null || break
    done
    # A launcher that ended while the trap ran was reaped then, and the loop kept wait's 128+signal: bash keeps a
    # reaped child's status, so this wait gives the launcher's own (a finished run was requeued).
    wait "$HVT_LAUNCHER_PID" && status=0 || status=$?
    trap - USR1
    # A run that finished (exit 0) while the signal was being handled, e.g. in its final evaluation, is done.
    if [ -n "$HVT_STOP_SIGNAL" ] && [ "$status" -eq 0 ]; then
        echo "[slurm] got SIG$HVT_STOP_SIGNAL but the run finished: not requeueing job $SLURM_JOB_ID"
    elif [ -n "$HVT_STOP_SIGNAL" ]; then
        echo "[slurm] the job stopped on SIG$HVT_STOP_SIGNAL (launcher exit $status): requeueing job $SLURM_JOB_ID"
        scontrol requeue "$SLURM_JOB_ID" && exit 0
        hvt_die "scontrol requeue $SLURM_JOB_ID failed" "resubmit with --resume_from_checkpoint auto"
    fi
    exit "$status"
}
