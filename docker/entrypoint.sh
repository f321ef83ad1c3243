#!/usr/bin/env bash
# Entry point of the horovod-train images. With HVT_SSHD=1 (multi-node horovodrun/mpirun between
# containers) it first starts sshd on $SSH_PORT, key-only (docker/sshd_config), accepting the public
# keys mounted at /root/.ssh/authorized_keys; ssh from this container uses the same port. Then it runs
# the command (default: bash).
set -euo pipefail
# hvt_die: launch/lib.sh of this checkout, or of the image (this file is /usr/local/bin/hvt-entrypoint there).
lib=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../launch/lib.sh
[ -f "$lib" ] || lib=/opt/horovod-train/launch/lib.sh
# shellcheck source=launch/lib.sh
source "$lib"

if [ "${HVT_SSHD:-0}" = 1 ]; then
    port=${SSH_PORT:-12345}
    [[ $port =~ ^[1-9][0-9]*$ ]] || hvt_die "SSH_PORT '$port' is not a port number" "pass -e SSH_PORT=12345"
    [ -s /root/.ssh/authorized_keys ] || hvt_die "no /root/.ssh/authorized_keys in the container" \
        "mount the public key(s): -v /path/to/keys/authorized_keys:/root/.ssh/authorized_keys:ro"
    ssh-keygen -A >/dev/null
    mkdir -p /run/sshd /etc/ssh/ssh_config.d
    # Client side: the other containers listen on the same port; their host keys are new every start.
    printf 'Host *\n    Port %s\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n    LogLevel ERROR\n' \
        "$port" >/etc/ssh/ssh_config.d/horovod-train.conf
    /usr/sbin/sshd -p "$port"
    echo "[entrypoint] sshd listening on port $port (public key only)"
fi
exec "$@"
