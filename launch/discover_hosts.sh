#!/usr/bin/env bash
# Elastic Horovod host discovery: print the hosts that may run workers right now, one `host:slots` per
# line. horovodrun calls it every few seconds, so editing the hosts file while a job runs adds or
# removes hosts (for elastic training; see docs/launch.md):
#   horovodrun -np 2 --min-np 1 --max-np 8 --host-discovery-script launch/discover_hosts.sh python -m ...
# The file (HVT_HOSTS_FILE, default launch/elastic_hosts.txt, ignored by git; see
# launch/elastic_hosts.example) holds `host:slots` or `host slots=N` lines and # comments.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

file=${HVT_HOSTS_FILE:-$HVT_LAUNCH_DIR/elastic_hosts.txt}
[ -f "$file" ] || hvt_die "hosts file $file does not exist" \
    "cp $HVT_LAUNCH_DIR/elastic_hosts.example $file (or set HVT_HOSTS_FILE) and list host:slots lines"
n=0
out=()
while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    line=${line%%#*}
    line=${line//[[:space:]]/ }
    read -r -a words <<<"$line"
    case ${#words[@]} in
    0) continue ;;
    1) entry=${words[0]} ;;
    2) entry=${words[0]}:${words[1]#slots=} ;;
    *) entry="" ;;
    esac
    [[ $entry =~ ^[A-Za-z0-9._-]+:[1-9][0-9]*$ ]] ||
        hvt_die "line $n of $file ('$line') is not host:slots" "write one host:slots (or 'host slots=N') per line"
    out+=("$entry")
done <"$file"
# Print only a complete, valid list: a half-edited file must not shrink the job by accident. An empty one is a file
# being rewritten: fail (Horovod's driver retries a failed discovery) instead of answering "no hosts", which it
# reads as every host removed.
[ "${#out[@]}" -gt 0 ] || hvt_die "hosts file $file lists no hosts (is it being rewritten?)" \
    "list at least one host:slots line; to stop the job, stop horovodrun"
printf '%s\n' "${out[@]}"
