#!/usr/bin/env bash
# Submit one of the launch/slurm jobs with one task per GPU: --gpus-per-node N adds --gres=gpu:N and
# --ntasks-per-node=N; without it (CPU-only clusters) no GPU flag is passed at all.
#
# Usage: launch/slurm/submit.sh JOB [--nodes N] [--gpus-per-node N] [--ntasks-per-node N] [--cpus-per-task N]
#          [--partition P] [--time T] [--output FILE] [--sbatch ARG]... [-- training args]
#   JOB: horovod_srun | horovod_mpirun | ddp_torchrun | horovod_apptainer
#   --sbatch ARG: any other sbatch option, e.g. --sbatch --account=proj --sbatch --constraint=a100
# Example on a SLURM cluster: launch/slurm/submit.sh horovod_srun --nodes 2 --gpus-per-node 4 --cpus-per-task 8 -- --config configs/demo.yaml
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

jobs="horovod_srun horovod_mpirun ddp_torchrun horovod_apptainer"
job=${1:-}
[ -n "$job" ] || hvt_die "no job given" "pass one of: $jobs"
[ -f "$HVT_LAUNCH_DIR/slurm/$job.sbatch" ] || hvt_die "unknown job '$job'" "pass one of: $jobs"
shift
gpus="" tasks=""
opts=()
while [ "$#" -gt 0 ]; do
    case $1 in
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
    --nodes | --gpus-per-node | --ntasks-per-node | --cpus-per-task)
        hvt_value "$1" "$#" && hvt_count "$1" "$2"
        case $1 in
        --gpus-per-node) gpus=$2 ;;
        --ntasks-per-node) tasks=$2 ;;
        *) opts+=("$1=$2") ;;
        esac
        shift 2
        ;;
    --partition | --time | --output | --sbatch)
        hvt_value "$1" "$#"
        if [ "$1" = --sbatch ]; then opts+=("$2"); else opts+=("$1=$2"); fi
        shift 2
        ;;
    --)
        shift
        break
        ;;
    *) hvt_die "unknown option '$1'" "see the usage at the top of launch/slurm/submit.sh; training arguments go after --" ;;
    esac
done
if [ "${gpus:-0}" -gt 0 ]; then
    [ -z "$tasks" ] || [ "$tasks" = "$gpus" ] ||
        hvt_die "--ntasks-per-node $tasks differs from --gpus-per-node $gpus" "one task per GPU: drop --ntasks-per-node"
    opts+=(--gres="gpu:$gpus" --ntasks-per-node="$gpus")
elif [ -n "$tasks" ]; then
    [ "$tasks" -gt 0 ] || hvt_die "--ntasks-per-node needs a whole number > 0" "pass e.g. --ntasks-per-node 2"
    opts+=(--ntasks-per-node="$tasks")
fi
hvt_need_command sbatch "run this on a SLURM login node"
hvt_run sbatch --export="ALL,HVT_REPO=$HVT_REPO" "${opts[@]}" "$HVT_LAUNCH_DIR/slurm/$job.sbatch" "$@"
