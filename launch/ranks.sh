# shellcheck shell=bash
# Which processes on this machine are training ranks, for the scripts that turn a scheduler's stop into a
# checkpoint: launch/k8s/pod.sh (a pod's SIGTERM) and launch/slurm/common.sh (SLURM's warning signal, which ships
# these functions to every node with `declare -f`: they use nothing else). Sourced, not run.
#
# A rank is found by what it is, not by how it was started (`python -m horovod_train`, the `horovod-train` console
# script, torchrun's workers, a container): a Python process that catches SIGUSR1. A rank installs its
# --checkpoint_signals handlers (SIGUSR1 among them by default) when its run starts, and its forked children
# (DataLoader and tokenizer workers) ignore those signals instead (horovod_train/training/stopping.py), so the checkpoint
# signal goes to the process that handles it and never to one that would die of it (a launcher, a rank still
# starting). Two more rules keep launchers out: torchrun's agent is never a rank (it catches SIGUSR1 too when
# TORCHELASTIC_SIGNALS_TO_HANDLE names it, and then ends its workers), nor launch/error_last.py (it passes SIGUSR1
# on to the launcher it runs: horovodrun would die of it), and neither is the parent of another candidate (a
# launcher that catches it around a rank: mpirun, apptainer, a probe in the tests).
#
# The functions end on their test, never on a bare `return`: pod.sh calls them from a trap, where a bare `return`
# gives the status of the command the trap interrupted (its `wait`: 143).

# shellcheck disable=SC2034 # launch/slurm/common.sh ships them (declare -f)
HVT_RANK_FUNCTIONS=(hvt_training_ranks hvt_rank_candidate hvt_catches_signal hvt_launcher_program)

# hvt_training_ranks IN_SCOPE: the training ranks among the processes PID for which `IN_SCOPE PID` succeeds, one pid
# per line.
hvt_training_ranks() {
    local in_scope=$1 dir pid stat candidate other is_parent usr1_bit
    local -a candidates=() parents=()
    usr1_bit=$(($(kill -l USR1) - 1))
    for dir in /proc/[0-9]*; do
        pid=${dir#/proc/}
        [ "$pid" != "$$" ] || continue
        hvt_rank_candidate "$pid" "$usr1_bit" || continue # first: builtins only, no process started
        "$in_scope" "$pid" || continue
        read -r stat 2>/dev/null <"$dir/stat" || continue
        stat=${stat##*) } # after "pid (comm) ": "state ppid ..."
        stat=${stat#* }
        candidates+=("$pid")
        parents+=("${stat%% *}")
    done
    for candidate in "${candidates[@]}"; do
        is_parent=0
        for other in "${parents[@]}"; do
            [ "$other" != "$candidate" ] || is_parent=1
        done
        [ "$is_parent" = 1 ] || echo "$candidate"
    done
}

# hvt_rank_candidate PID USR1_BIT: a Python process (its program, argv[0], is python*: the console script's too,
# which the kernel runs as `python .../horovod-train`) that catches SIGUSR1 and runs no launcher's program.
hvt_rank_candidate() {
    local program
    local -a argv
    hvt_catches_signal "$1" "$2" || return 1
    mapfile -d '' -t argv 2>/dev/null <"/proc/$1/cmdline" || return 1
    program=${argv[0]:-}
    [[ ${program##*/} == python* ]] && ! hvt_launcher_program "$1"
}

# hvt_catches_signal PID BIT: whether PID has a handler for the signal of BIT in SigCgt of /proc/PID/status (bit
# N-1 for signal N; an ignored signal is in SigIgn instead).
hvt_catches_signal() {
    local name="" mask=""
    while read -r name mask; do
        [ "$name" != SigCgt: ] || break
    done 2>/dev/null <"/proc/$1/status"
    [ "$name" = SigCgt: ] && (((16#${mask: -8} >> $2) & 1))
}

# hvt_launcher_program PID: whether PID runs torchrun or launch/error_last.py, by its program, not by any of its
# words (a worker's `--output_dir /runs/torchrun` is an argument): the script after the interpreter's options is
# named torchrun or error_last.py, or the module after -m is torch.distributed.run.
hvt_launcher_program() {
    local program="" i=1
    local -a argv
    mapfile -d '' -t argv 2>/dev/null <"/proc/$1/cmdline" || return 1
    while [ "$i" -lt "${#argv[@]}" ]; do
        case ${argv[i]} in
        -m)
            program=${argv[i + 1]:-}
            break
            ;;
        -c) break ;;
        -W | -X) i=$((i + 2)) ;; # an option with a value
        -*) i=$((i + 1)) ;;
        *)
            program=${argv[i]##*/}
            break
            ;;
        esac
    done
    [ "$program" = torchrun ] || [ "$program" = torch.distributed.run ] || [ "$program" = error_last.py ]
}
