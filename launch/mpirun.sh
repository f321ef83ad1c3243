#!/usr/bin/env bash
# Plain mpirun (OpenMPI) with the flags Horovod documents, Horovod's MPI controller in the ranks. The command line
# comes from horovod_train/launching/ (mpirun_command: the documented flags of mpirun_flags.txt, Open MPI's
# libfabric BTL excluded, --allow-run-as-root only when run as root, and -x for PATH, NCCL_DEBUG, LD_LIBRARY_PATH
# and every HOROVOD_*, NCCL_*, HF_*, TRANSFORMERS_*, PYTHON* and OMP_NUM_THREADS variable set here, so HOROVOD_*
# settings reach every rank).
#
# Usage: launch/mpirun.sh [-np N] [-H host:slots,... | --hostfile FILE] [--ssh-port PORT]
#          [--ssh-identity-file KEY] [--network-interfaces eth0[,ib0]] [--oversubscribe] [-x VAR]...
#          [Horovod knobs] [-- training args]
#   Horovod knobs become HOROVOD_* variables: --fusion-threshold-mb MB (HOROVOD_FUSION_THRESHOLD),
#     --cycle-time-ms MS (HOROVOD_CYCLE_TIME), --cache-capacity N (HOROVOD_CACHE_CAPACITY),
#     --timeline-filename FILE (HOROVOD_TIMELINE), --timeline-mark-cycles, --autotune (HOROVOD_AUTOTUNE),
#     --autotune-log-file FILE (HOROVOD_AUTOTUNE_LOG).
#   --network-interfaces: Open MPI's TCP interfaces (BTL and out-of-band), NCCL_SOCKET_IFNAME for NCCL.
#   -np defaults to the slots of -H/--hostfile, else one per GPU here, else 2.
#   Training args: anything `python -m horovod_train train` takes; none = configs/demo.yaml;
#     `doctor --engine horovod` instead prints the rank -> local rank -> host -> device map.
# Example on several hosts: launch/mpirun.sh -np 8 -H node1:4,node2:4 -- --config configs/demo.yaml
# Not HOROVOD_HIERARCHICAL_ALLREDUCE=1 with these flags: its cross-node step is an MPI all-reduce of host
# memory, and these flags keep MPI on TCP, so it would move the cross-node traffic from NCCL (InfiniBand/RoCE
# when present) to TCP. NCCL's own ring/tree already reduces within each node first.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

np="" slots=0
launch=() # options of python -m horovod_train.launching mpirun
while [ "$#" -gt 0 ]; do
    case $1 in
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
    -np | -n | --np)
        hvt_value "$1" "$#" && hvt_positive_int "$1" "$2"
        np=$2
        shift 2
        ;;
    -H | --host | --hosts)
        hvt_value "$1" "$#"
        [ "$slots" -eq 0 ] || hvt_die "both -H and --hostfile given" "pass one of them"
        slots=$(hvt_host_slots "$2")
        launch+=(--hosts "$2")
        shift 2
        ;;
    --hostfile)
        hvt_value "$1" "$#"
        [ "$slots" -eq 0 ] || hvt_die "both -H and --hostfile given" "pass one of them"
        slots=$(hvt_host_slots "$(hvt_hostfile_hosts "$2")")
        launch+=(--hostfile "$2")
        shift 2
        ;;
    --ssh-port)
        hvt_value "$1" "$#" && hvt_positive_int "$1" "$2" 65535
        launch+=(--ssh-port "$2")
        shift 2
        ;;
    --ssh-identity-file)
        hvt_value "$1" "$#" && hvt_ssh_identity "$1" "$2"
        launch+=(--ssh-identity-file "$2")
        shift 2
        ;;
    --network-interfaces | --network-interface)
        hvt_value "$1" "$#" && hvt_nic_list "$1" "$2"
        launch+=(--network-interfaces "$2")
        export NCCL_SOCKET_IFNAME=$2
        shift 2
        ;;
    --oversubscribe)
        launch+=(--oversubscribe)
        shift
        ;;
    -x)
        hvt_value "$1" "$#"
        [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*(=.*)?$ ]] || hvt_die "-x $2 is not VAR or VAR=value" "pass a variable's name"
        launch+=(-x "$2")
        shift 2
        ;;
    --fusion-threshold-mb)
        hvt_value "$1" "$#" && hvt_count "$1" "$2" 1048576
        export HOROVOD_FUSION_THRESHOLD=$(($2 * 1024 * 1024))
        shift 2
        ;;
    --cycle-time-ms)
        hvt_value "$1" "$#" && hvt_number "$1" "$2"
        export HOROVOD_CYCLE_TIME=$2
        shift 2
        ;;
    --cache-capacity)
        hvt_value "$1" "$#" && hvt_count "$1" "$2"
        export HOROVOD_CACHE_CAPACITY=$2
        shift 2
        ;;
    --timeline-filename)
        hvt_value "$1" "$#" && hvt_parent_dir "$1" "$2"
        export HOROVOD_TIMELINE=$2
        shift 2
        ;;
    --timeline-mark-cycles)
        export HOROVOD_TIMELINE_MARK_CYCLES=1
        shift
        ;;
    --autotune)
        export HOROVOD_AUTOTUNE=1
        shift
        ;;
    --autotune-log-file)
        hvt_value "$1" "$#" && hvt_parent_dir "$1" "$2"
        export HOROVOD_AUTOTUNE_LOG=$2
        shift 2
        ;;
    --)
        shift
        break
        ;;
    *) hvt_die "unknown launcher option '$1'" "see the usage at the top of launch/mpirun.sh; training arguments go after --" ;;
    esac
done

np=$(hvt_ranks "$np" "$slots")

hvt_find_python
hvt_need_command mpirun "load an MPI ('module load openmpi') or run scripts/install_mpi.sh"
mpirun --version 2>/dev/null | grep -q 'Open MPI' ||
    hvt_die "mpirun on PATH is not Open MPI ($(command -v mpirun))" "put Open MPI first on PATH (this script uses its flags)"

# NCCL_DEBUG defaults to WARN, and is passed to the ranks with the other variables set here.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
hvt_command "$@"
hvt_launch_command mpirun --np "$np" "${launch[@]}" -- "$HVT_PY" -m horovod_train "${HVT_CMD[@]}"
hvt_run "${HVT_LAUNCH[@]}"
