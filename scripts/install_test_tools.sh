#!/usr/bin/env bash
# The system commands the integration and system tests drive (`make test` runs this; `make test-fast` needs none):
# the shell linter, ssh (multi-host launches), ip/unshare (network namespaces), a SLURM cluster with munge, and
# Podman with what it builds images with. As root with apt-get, the missing Debian packages are installed; otherwise
# the tests that need them say what is missing and are skipped. Idempotent: nothing to do takes milliseconds.
set -euo pipefail

# command -> Debian package
declare -A PACKAGES=(
    [shellcheck]=shellcheck
    [/usr/sbin/sshd]=openssh-server [ssh]=openssh-client [ssh-keygen]=openssh-client
    [ip]=iproute2 [unshare]=util-linux
    [slurmctld]=slurmctld [slurmd]=slurmd [sbatch]=slurm-client [munged]=munge
    [podman]=podman [buildah]=buildah [mmdebstrap]=mmdebstrap [runc]=runc [slirp4netns]=slirp4netns
    [newuidmap]=uidmap [iptables]=iptables
)

have() { if [[ $1 == /* ]]; then [ -f "$1" ]; else command -v "$1" >/dev/null 2>&1; fi; }

# Sets WANTED: the Debian packages of the missing commands, sorted.
find_missing() {
    local command
    local -a missing=()
    for command in "${!PACKAGES[@]}"; do
        have "$command" || missing+=("${PACKAGES[$command]}")
    done
    WANTED=()
    [ ${#missing[@]} -eq 0 ] || mapfile -t WANTED < <(printf '%s\n' "${missing[@]}" | sort -u)
}

find_missing
[ ${#WANTED[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "[test-tools] missing: ${WANTED[*]} (Debian packages); the tests that need them are skipped" >&2
    exit 0
fi
# Two test runs starting at once on a new machine: the second waits for the first's install, then finds less or
# nothing missing (apt refuses a second apt at once, and the first's EXIT trap removes policy-rc.d).
lock_dir=/run/lock
[ -d "$lock_dir" ] || lock_dir=/tmp
exec 9>"$lock_dir/horovod-train-install-test-tools.lock"
flock 9
find_missing
[ ${#WANTED[@]} -eq 0 ] && exit 0
echo "[test-tools] installing ${WANTED[*]}"
export DEBIAN_FRONTEND=noninteractive
# Packages such as openssh-server and munge would start their system daemons: keep them from doing so.
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    created_policy=1
fi
trap 'if [ $created_policy -eq 1 ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${WANTED[@]}" >/dev/null
