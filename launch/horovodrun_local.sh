#!/usr/bin/env bash
# horovodrun on this machine: one rank per GPU (or 2 ranks on a CPU-only machine), Gloo controller.
#
# Usage: launch/horovodrun_local.sh [-np N] [--gloo|--mpi] [Horovod knobs] [-- training args]
#   Horovod knobs (passed to horovodrun as is): --fusion-threshold-mb MB, --cycle-time-ms MS,
#     --cache-capacity N, --timeline-filename FILE [--timeline-mark-cycles], --autotune
#     [--autotune-log-file FILE], --network-interfaces eth0[,ib0], --hierarchical-allreduce,
#     --start-timeout S, --verbose
#   Training args: anything `python -m horovod_train train` takes; none = configs/demo.yaml;
#     `doctor [--engine E]` instead prints the rank -> local rank -> host -> device map (check a launch).
#   Env: HVT_PYTHON (default: the checkout's .venv/bin/python, else python3).
# Example: launch/horovodrun_local.sh -np 2 --fusion-threshold-mb 64 --cycle-time-ms 5 -- --config configs/demo.yaml \
#            --max_steps 50 --output_dir runs/horovodrun-local
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hvt_horovodrun local "$@"
