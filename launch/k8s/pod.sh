#!/usr/bin/env bash
# shellcheck disable=SC2317 # stop, training_ranks and in_scope run from the TERM trap
# The main process of a horovod-train pod (launch/k8s/*.yaml). Kubernetes stops a pod by sending SIGTERM to
# its main process alone, then SIGKILL after terminationGracePeriodSeconds. This script turns that SIGTERM
# into the training's checkpoint signal: it sends SIGUSR1 to the training ranks running in this pod (they
# agree at the next step, rank 0 writes a checkpoint, every rank exits with 75; ranks in other pods stop with
# them), optionally passes a signal to the launcher it started (--forward USR1 for mpirun, which hands it
# to every rank), and keeps the pod alive until the ranks are gone. A restarted pod runs the same command,
# which carries --resume_from_checkpoint auto.
#
# Usage: launch/k8s/pod.sh worker                        (MPIJob workers: sshd runs, the ranks arrive over ssh)
#        launch/k8s/pod.sh run [--forward SIG] -- CMD...  (launchers: mpirun, horovodrun, torchrun)
# Env: HVT_SSH_SECRET_DIR: where the MPI Operator mounted the job's ssh Secret (the MPIJobs' sshAuthMountPath).
#   Its files are copied to ~/.ssh with the modes ssh and sshd demand: a Secret volume's directory is
#   world-writable, which sshd's StrictModes refuses, so the Secret is not mounted at ~/.ssh itself.
#   SSH_PORT: the port of the workers' sshd (key only, the image's /etc/ssh/sshd_config).
set -euo pipefail
# shellcheck source=launch/ranks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../ranks.sh"

die() {
    echo "error: $1; fix: $2" >&2
    exit 2
}

# in_scope PID: whether PID belongs to this pod. As the container's main process (PID 1: the pod's own PID
# namespace) every process is the pod's, the ranks that sshd started included; anywhere else (a test, a
# shared machine) only this script's descendants are, so that no one else's training is ever signalled.
in_scope() {
    local pid=$1 stat
    [ $$ != 1 ] || return 0
    while [ "$pid" -gt 1 ]; do
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
        stat=${stat##*) }
        stat=${stat#* }
        pid=${stat%% *}
        [ "$pid" != $$ ] || return 0
    done
    return 1
}

# training_ranks: the pids of this pod's training ranks, one per line (launch/ranks.sh: Python processes that
# catch SIGUSR1, neither torchrun's agent nor the parent of another such process).
training_ranks() {
    hvt_training_ranks in_scope
}

# install_ssh_keys: the job's key pair and authorized_keys from HVT_SSH_SECRET_DIR into ~/.ssh.
install_ssh_keys() {
    local dir=${HVT_SSH_SECRET_DIR:-} file
    [ -n "$dir" ] || return 0
    [ -s "$dir/authorized_keys" ] || die "no authorized_keys in HVT_SSH_SECRET_DIR=$dir" \
        "set sshAuthMountPath of the MPIJob to $dir (the MPI Operator mounts the job's ssh Secret there)"
    install -d -m 700 "$HOME/.ssh"
    for file in id_rsa id_rsa.pub authorized_keys; do
        [ ! -f "$dir/$file" ] || install -m 600 "$dir/$file" "$HOME/.ssh/$file"
    done
}

forward=""
mode=${1:-}
case "$mode" in
worker)
    [ $# -eq 1 ] || die "pod.sh worker takes no arguments" "use: launch/k8s/pod.sh worker"
    [ -n "${HVT_SSH_SECRET_DIR:-}" ] || die "HVT_SSH_SECRET_DIR is not set" "set it to the MPIJob's sshAuthMountPath"
    port=${SSH_PORT:-12345}
    [[ $port =~ ^[1-9][0-9]{0,4}$ ]] || die "SSH_PORT '$port' is not a port number" "set SSH_PORT=12345"
    install_ssh_keys
    ssh-keygen -A >/dev/null
    mkdir -p /run/sshd
    /usr/sbin/sshd -p "$port"
    echo "[pod] sshd listening on port $port (public key only)" >&2
    sleep infinity &
    ;;
run)
    shift
    if [ "${1:-}" = --forward ]; then
        [[ ${2:-} =~ ^(USR1|USR2|TERM|INT)$ ]] || die "--forward '${2:-}' is not USR1, USR2, TERM or INT" "pass e.g. --forward USR1"
        forward=$2
        shift 2
    fi
    [ "${1:-}" = -- ] && shift
    [ $# -gt 0 ] || die "pod.sh run needs a command" "use: launch/k8s/pod.sh run [--forward SIG] -- CMD..."
    install_ssh_keys
    "$@" &
    ;;
*) die "unknown mode '${1:-}'" "use: launch/k8s/pod.sh worker | run [--forward SIG] -- CMD..." ;;
esac
child=$!

stop() {
    local ranks
    ranks=$(training_ranks)
    echo "[pod] SIGTERM: checkpoint signal to ranks: ${ranks//$'\n'/ }${forward:+, SIG$forward to the launcher}" >&2
    [ -z "$forward" ] || kill -s "$forward" "$child" 2>/dev/null || true
    # shellcheck disable=SC2086 # one pid per word
    [ -z "$ranks" ] || kill -USR1 $ranks 2>/dev/null || true
    if [ "$mode" = worker ]; then
        # Until the signalled ranks are gone (a rank that stopped ignores SIGUSR1: it is no longer "found").
        local rank
        for rank in $ranks; do
            while kill -0 "$rank" 2>/dev/null; do sleep 1; done
        done
        kill "$child" 2>/dev/null || true
    fi
}
trap stop TERM

while :; do
    status=0
    wait "$child" || status=$?
    # A trapped signal interrupts wait (status > 128) while the child still runs: wait again.
    kill -0 "$child" 2>/dev/null || break
done
[ "$mode" = worker ] && exit 0
exit "$status"
