# shellcheck shell=bash
# Shared by the launch/ scripts (sourced, not run): find the checkout and its Python, validate input
# with one-line errors (exit 2), print the effective command, then run it.

HVT_LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HVT_REPO=${HVT_REPO:-$(cd "$HVT_LAUNCH_DIR/.." && pwd)}

# hvt_die PROBLEM FIX: the project's error format (horovod_train/common/errors.py), exit 2.
hvt_die() {
    echo "error: $1; fix: $2" >&2
    exit 2
}

# Sets HVT_PY (a Python that imports horovod_train) and puts its bin/ first on PATH, so horovodrun,
# torchrun and the ranks' `python` all come from the same environment. HVT_PYTHON overrides.
hvt_find_python() {
    local py=${HVT_PYTHON:-}
    if [ -z "$py" ]; then
        if [ -x "$HVT_REPO/.venv/bin/python" ]; then
            py=$HVT_REPO/.venv/bin/python
        else
            py=$(command -v python3 || true)
        fi
    fi
    if [ -n "${HVT_PYTHON:-}" ] && ! [ -x "$py" ]; then
        hvt_die "HVT_PYTHON=$py is not an executable" "set HVT_PYTHON to a Python that has horovod_train installed"
    elif [ -z "$py" ]; then
        hvt_die "no Python found (no $HVT_REPO/.venv, no python3 on PATH)" \
            "run 'make setup' in $HVT_REPO or set HVT_PYTHON to a Python that has horovod_train installed"
    fi
    if ! "$py" -c 'import horovod_train' 2>/dev/null; then
        hvt_die "$py cannot import horovod_train" \
            "run 'make setup' in $HVT_REPO or set HVT_PYTHON to a Python that has horovod_train installed"
    fi
    HVT_PY=$py
    HVT_BIN=$(dirname "$py")
    PATH="$HVT_BIN:$PATH"
    export PATH
}

# hvt_need_command NAME FIX
hvt_need_command() {
    command -v "$1" >/dev/null 2>&1 || hvt_die "$1 is not on PATH" "$2"
}

# hvt_positive_int OPTION VALUE [MAX]: a whole number in 1..MAX (default 1000000). Checked by its digits first:
# bash arithmetic on a longer one overflows (a second error line, or a wrong comparison).
hvt_positive_int() {
    local max=${3:-1000000}
    if ! [[ $2 =~ ^[1-9][0-9]{0,8}$ ]] || [ "$2" -gt "$max" ]; then
        hvt_die "$1 needs a whole number in 1..$max (got '$2')" "pass e.g. $1 2"
    fi
}

# hvt_count OPTION VALUE [MAX]: a whole number in 0..MAX (default 1000000).
hvt_count() {
    local max=${3:-1000000}
    if ! [[ $2 =~ ^[0-9]{1,9}$ ]] || [ "$((10#$2))" -gt "$max" ]; then
        hvt_die "$1 needs a whole number in 0..$max (got '$2')" "pass e.g. $1 64"
    fi
}

# hvt_ssh_identity OPTION FILE: a private key ssh can be given on the launchers' command lines. Open MPI's
# plm_rsh_args and horovodrun's ssh command are split at whitespace, so a path with a space would reach ssh
# as two arguments.
hvt_ssh_identity() {
    [ -f "$2" ] || hvt_die "$1 $2 does not exist" "pass the private key ssh should use"
    [[ $2 =~ ^[A-Za-z0-9_./+@%:,=-]+$ ]] ||
        hvt_die "$1 '$2' has a space or a shell character (the launchers split ssh's arguments at spaces)" \
            "use a path without them, e.g. a link: ln -s '$2' ~/.ssh/hvt_key"
}

# hvt_number OPTION VALUE: a non-negative number (integer or decimal).
hvt_number() {
    [[ $2 =~ ^[0-9]+([.][0-9]+)?$ ]] || hvt_die "$1 needs a number >= 0 (got '$2')" "pass e.g. $1 5"
}

# hvt_value OPTION ARGC: an option that takes a value must have one.
hvt_value() {
    [ "$2" -ge 2 ] || hvt_die "$1 needs a value" "pass $1 VALUE"
}

# hvt_parent_dir OPTION PATH: a file the job will write must have an existing directory.
hvt_parent_dir() {
    local dir
    dir=$(dirname "$2")
    [ -d "$dir" ] || hvt_die "$1 $2: directory $dir does not exist" "create it first (mkdir -p $dir)"
}

# hvt_host_slots HOSTS: validate `host:slots,...`; prints the total number of slots.
hvt_host_slots() {
    local total=0 entry
    local -a entries
    IFS=, read -r -a entries <<<"$1"
    [ "${#entries[@]}" -gt 0 ] || hvt_die "-H needs host:slots entries" "pass e.g. -H node1:4,node2:4"
    for entry in "${entries[@]}"; do
        [[ $entry =~ ^[A-Za-z0-9._-]+:([1-9][0-9]{0,5})$ ]] ||
            hvt_die "-H entry '$entry' is not host:slots (slots 1..999999)" "pass e.g. -H node1:4,node2:4"
        total=$((total + BASH_REMATCH[1]))
    done
    echo "$total"
}

# hvt_hostfile_hosts FILE: validate a hostfile (`host slots=N` lines, blank lines and # comments) and
# print it as host:slots,... (horovodrun's own --hostfile parser takes no comments or blank lines).
hvt_hostfile_hosts() {
    local file=$1 line n=0
    local -a found=()
    [ -f "$file" ] || hvt_die "hostfile $file does not exist" "pass an existing file of 'host slots=N' lines"
    while IFS= read -r line || [ -n "$line" ]; do
        n=$((n + 1))
        line=${line%%#*}
        line=${line#"${line%%[![:space:]]*}"}
        line=${line%"${line##*[![:space:]]}"}
        [ -n "$line" ] || continue
        [[ $line =~ ^([A-Za-z0-9._-]+)[[:space:]]+slots=([1-9][0-9]{0,5})$ ]] ||
            hvt_die "line $n of hostfile $file ('$line') is not 'host slots=N'" "write one 'host slots=N' per line"
        found+=("${BASH_REMATCH[1]}:${BASH_REMATCH[2]}")
    done <"$file"
    [ "${#found[@]}" -gt 0 ] || hvt_die "hostfile $file lists no hosts" "write one 'host slots=N' per line"
    (
        IFS=,
        echo "${found[*]}"
    )
}

# hvt_ranks NP SLOTS: the number of ranks to start. NP if given (at most SLOTS when hosts were given),
# else the hosts' SLOTS, else one per GPU here, else 2.
hvt_ranks() {
    local np=$1 slots=$2
    if [ "$slots" -gt 0 ]; then
        np=${np:-$slots}
        [ "$np" -le "$slots" ] || hvt_die "-np $np is more than the $slots slots of the hosts" "lower -np or add slots"
    else
        np=${np:-$(hvt_gpu_count)}
        [ "$np" -gt 0 ] || np=2
    fi
    echo "$np"
}

# hvt_gpu_count: GPUs visible on this machine (0 without nvidia-smi).
hvt_gpu_count() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
    else
        echo 0
    fi
}

# hvt_command ARGS...: the horovod_train command line every rank runs. ARGS are training arguments
# (`train` is implied), or a subcommand and its arguments (`doctor` prints the rank/host/device map, to
# check a launch before training); none = train the embedded demo job. Sets HVT_CMD.
hvt_command() {
    case ${1:-} in
    train | doctor) HVT_CMD=("$@") ;;
    "") HVT_CMD=(train --config "${HVT_DEFAULT_CONFIG:-$HVT_REPO/configs/demo.yaml}") ;;
    *) HVT_CMD=(train "$@") ;;
    esac
}

# hvt_print_command CMD...: the effective command, copy-pasteable after the '+ '.
hvt_print_command() {
    local word line="+"
    for word in "$@"; do
        if [[ $word =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then
            line+=" $word"
        elif [[ $word != *"'"* ]]; then
            line+=" '$word'"
        else
            line+=" $(printf '%q' "$word")"
        fi
    done
    echo "$line"
}

# hvt_run CMD...: print the effective command, then replace this shell with launch/error_last.py running it: a
# rank's one-line usage error is printed last, after the launcher's own report of the failed rank, with exit
# status 2; signals sent to this script reach the launcher.
hvt_run() {
    hvt_print_command "$@"
    exec "${HVT_PY:-python3}" "$HVT_LAUNCH_DIR/error_last.py" "$@"
}

# hvt_nic_list OPTION LIST: comma-separated interface names that exist on this machine.
hvt_nic_list() {
    local nic
    local -a nics
    [[ $2 =~ ^[A-Za-z0-9._@-]+(,[A-Za-z0-9._@-]+)*$ ]] ||
        hvt_die "$1 '$2' is not a comma-separated list of interface names" "pass e.g. $1 eth0 or $1 ib0,eth0"
    IFS=, read -r -a nics <<<"$2"
    for nic in "${nics[@]}"; do
        if [ -d /sys/class/net ] && ! [ -e "/sys/class/net/$nic" ]; then
            hvt_die "network interface $nic does not exist on $(hostname)" \
                "pass interfaces present on every host (list them with 'ip -br link')"
        fi
    done
}

# hvt_launch_command KIND OPTIONS... -- PROGRAM...: a launcher's command line (KIND: mpirun, horovodrun, torchrun,
# srun), built by horovod_train/launching/, the one place that knows launcher flags (see its usage with
# --help); sets HVT_LAUNCH. It needs only the standard library: HVT_PY if found, else python3, with this checkout
# first on its path. Bad options: its one error line, and this script exits with its code.
hvt_launch_command() {
    local status
    # The checkout is put on Python's path by -c, not by PYTHONPATH: the command forwards the variables it sees
    # set (mpirun -x PYTHONPATH), and the launcher would not have this one (Open MPI warns of each unset -x).
    mapfile -d '' -t HVT_LAUNCH < <(
        "${HVT_PY:-python3}" -c 'import sys; sys.path.insert(0, sys.argv.pop(1))
from horovod_train.launching.__main__ import main; sys.exit(main())' "$HVT_REPO" "$@"
        printf '%s\0' "$?"
    )
    status=${HVT_LAUNCH[-1]:-1}
    unset 'HVT_LAUNCH[-1]'
    [ "$status" = 0 ] || exit "$status"
}

# Variables whose values are secrets. Under the Gloo controller horovodrun starts each rank as `env VAR=value ...
# python ...` with every exported variable, through ssh on other hosts: the values are on command lines that `ps`
# shows on every host. So these are not passed to horovodrun --gloo; the ranks read tokens from files instead
# (Hugging Face: ~/.cache/huggingface/token or HF_TOKEN_PATH; wandb: ~/.netrc). A *_PATH/*_FILE variable says
# where a secret is, and is kept.
HVT_SECRET_NAMES='(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|SECRET_KEY|PRIVATE_KEY|CREDENTIALS?)(_|$)'

# hvt_drop_secrets: unset the exported variables named like secrets (HVT_SECRET_NAMES), saying which.
hvt_drop_secrets() {
    local name upper
    local -a dropped=()
    while IFS= read -r name; do
        upper=${name^^}
        if ! [[ $upper =~ $HVT_SECRET_NAMES ]] || [[ $upper =~ _(PATH|FILE)$ ]]; then
            continue
        fi
        unset "$name"
        dropped+=("$name")
    done < <(compgen -e)
    [ "${#dropped[@]}" -eq 0 ] || echo "[launch] not passed to horovodrun --gloo, which puts every variable on" \
        "the ranks' command lines (ps shows them): ${dropped[*]}; give the ranks token files (docs/launch.md)"
}

# hvt_horovodrun MODE ARGS...: the horovodrun recipes. MODE is local (-np N on this machine) or
# multihost (-H host:slots,... or --hostfile FILE; ssh to the other hosts).
hvt_horovodrun() {
    local mode=$1 np="" hosts="" hostfile="" controller=--gloo slots=0 script
    local -a knobs=() placement=()
    script=launch/horovodrun_$mode.sh
    shift
    while [ "$#" -gt 0 ]; do
        case $1 in
        --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
        -np | --num-proc)
            hvt_value "$1" "$#" && hvt_positive_int "$1" "$2"
            np=$2
            shift 2
            ;;
        -H | --hosts | --hostfile | --ssh-port | --ssh-identity-file)
            [ "$mode" = multihost ] || hvt_die "$1 is for several hosts" "use launch/horovodrun_multihost.sh"
            hvt_value "$1" "$#"
            case $1 in
            -H | --hosts) hosts=$2 ;;
            --hostfile) hostfile=$2 ;;
            --ssh-port) hvt_positive_int "$1" "$2" 65535 && placement+=("$1" "$2") ;;
            --ssh-identity-file) hvt_ssh_identity "$1" "$2" && placement+=("$1" "$2") ;;
            esac
            shift 2
            ;;
        --gloo | --mpi)
            controller=$1
            shift
            ;;
        --network-interfaces | --network-interface)
            hvt_value "$1" "$#" && hvt_nic_list "$1" "$2"
            knobs+=(--network-interfaces "$2")
            shift 2
            ;;
        --fusion-threshold-mb | --cache-capacity | --start-timeout)
            hvt_value "$1" "$#" && hvt_count "$1" "$2"
            knobs+=("$1" "$2")
            shift 2
            ;;
        --cycle-time-ms)
            hvt_value "$1" "$#" && hvt_number "$1" "$2"
            knobs+=("$1" "$2")
            shift 2
            ;;
        --timeline-filename | --autotune-log-file)
            hvt_value "$1" "$#" && hvt_parent_dir "$1" "$2"
            knobs+=("$1" "$2")
            shift 2
            ;;
        --timeline-mark-cycles | --autotune | --verbose | --hierarchical-allreduce)
            knobs+=("$1")
            shift
            ;;
        --)
            shift
            break
            ;;
        *) hvt_die "unknown launcher option '$1'" "see the usage at the top of $script; training arguments go after --" ;;
        esac
    done

    if [ "$mode" = multihost ]; then
        if [ -n "$hosts" ] && [ -n "$hostfile" ]; then
            hvt_die "both -H and --hostfile given" "pass one of them"
        elif [ -n "$hosts" ]; then
            slots=$(hvt_host_slots "$hosts")
            placement=(--hosts "$hosts" "${placement[@]}")
        elif [ -n "$hostfile" ]; then
            hosts=$(hvt_hostfile_hosts "$hostfile")
            slots=$(hvt_host_slots "$hosts")
            placement=(--hosts "$hosts" "${placement[@]}")
        else
            hvt_die "no hosts given" "pass -H node1:4,node2:4 or --hostfile FILE ('host slots=N' lines)"
        fi
    fi
    np=$(hvt_ranks "$np" "$slots")

    hvt_find_python
    hvt_need_command horovodrun "run 'make setup' (scripts/build_horovod.sh installs Horovod) or set HVT_PYTHON"
    hvt_command "$@"
    [ "$controller" = --mpi ] || hvt_drop_secrets
    hvt_launch_command horovodrun --np "$np" "${placement[@]}" --controller "${controller#--}" \
        "${knobs[@]/#/--option=}" -- "$HVT_PY" -m horovod_train "${HVT_CMD[@]}"
    # By its path, as the ranks' Python: the printed command then runs as it is without .venv/bin on PATH.
    HVT_LAUNCH[0]=$(command -v "${HVT_LAUNCH[0]}")
    hvt_run "${HVT_LAUNCH[@]}"
}
