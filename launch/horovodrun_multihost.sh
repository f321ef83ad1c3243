#!/usr/bin/env bash
# horovodrun over several hosts: this machine starts the ranks on every host over ssh (key-only,
# no password prompt), so each host needs the same checkout path and Python (shared filesystem or
# the container image in docker/), and sshd reachable on --ssh-port.
#
# Usage: launch/horovodrun_multihost.sh (-H host:slots,... | --hostfile FILE) [-np N] [--gloo|--mpi]
#          [--ssh-port PORT] [--ssh-identity-file KEY] [Horovod knobs] [-- training args]
#   -np defaults to the total number of slots; a hostfile has one 'host slots=N' per line (and may have
#   blank lines and # comments); it is passed to horovodrun as the equivalent -H list.
#   --network-interfaces eth0[,ib0]: the interfaces the ranks talk over (same names on every host).
#   Other Horovod knobs and training args: as launch/horovodrun_local.sh.
# Example on several hosts: launch/horovodrun_multihost.sh -H node1:4,node2:4 --ssh-port 12345 --network-interfaces ib0 \
#            -- --config configs/demo.yaml --output_dir /shared/runs/8gpu
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hvt_horovodrun multihost "$@"
