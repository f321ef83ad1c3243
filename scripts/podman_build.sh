#!/usr/bin/env bash
# Build docker/Dockerfile (CPU or GPU variant) with Podman, on a machine that reaches package registries (PyPI,
# Debian) but no container registry, and possibly through a TLS-inspecting proxy. Used by
# tests/system/test_docker_build.py (CPU) and test_gpu_image.py (GPU); users run it too. From anywhere:
#
#   scripts/podman_build.sh build [--variant cpu|gpu] [--seed-horovod-wheel] [--tag TAG]... [-- podman build args]
#                                       # tags: IMAGE:VARIANT and IMAGE:VERSION-VARIANT (IMAGE: $HVT_IMAGE, default
#                                       # localhost/horovod-train; VERSION: pyproject.toml's, the package's
#                                       # __version__); each --tag replaces both
#   scripts/podman_build.sh base       # only the base image localhost/debian:bookworm-slim
#   scripts/podman_build.sh conf       # only the containers.conf; prints its path (export CONTAINERS_CONF=...)
#   scripts/podman_build.sh seed       # only --seed-horovod-wheel's step: verify the wheel, put it in the build cache
#   scripts/podman_build.sh up [--prefix P] [--tag TAG] [--ssh-port PORT] [--volume HOST:CTR]...
#                                       # two containers as two hosts (below); `down [--prefix P]` removes them,
#                                       # their network and key pair
#
# What it does, each step skipped when its result is already there:
#   conf   A containers.conf with runtime = "runc" (crun fails on hybrid-cgroup kernels) and default_ulimits
#          that the kernel accepts; exported as CONTAINERS_CONF unless you set one.
#   base   localhost/debian:bookworm-slim from `mmdebstrap --variant=minbase bookworm` with this host's Debian
#          apt sources, imported with `podman import`: `--build-arg BASE_IMAGE=debian:bookworm-slim` then
#          resolves to it, no registry needed (about 40 s, 127 MB).
#   build  `podman build --format docker` (without it podman drops SHELL, and RUN steps lose pipefail) with
#          BASE_IMAGE=debian:bookworm-slim and TORCH_INDEX_URL a one-page local file:// index holding the CPU
#          torch wheel this checkout's Python uses (found with `pip download`, cached); the wheel directory and
#          a pip.conf trusting the host pip's certificate bundle (`pip config list`: cert) are --volume'd into
#          every RUN step, so pip inside the build trusts what the host's pip trusts.
#          --variant gpu: the same Debian base, torch==requirements.txt's pin from PyPI (a CUDA 13 build with
#          its nvidia-* wheels, NCCL included), the CUDA toolkit from PyPI at torch's CUDA (docker/cuda_toolkit.sh:
#          nvcc, headers, cudart), Horovod with NCCL + MPI + Gloo; about 11 GB. No GPU is needed to build it.
#          --seed-horovod-wheel copies the Horovod wheels `make setup` and `make nccl-build` built
#          (~/.cache/horovod-train/wheels, CPU and CUDA builds) into
#          the build's cache mount, which saves the 5-minute compile; only when this host runs the base's
#          Debian release (same Python and Open MPI ABI), else it is ignored with a warning. The wheel must match
#          the SHA256SUMS recorded when scripts/build_horovod.sh built it; the build cache lies in a world-writable
#          directory, so whatever is there is replaced, its directories made ours alone, and the build checks the
#          digest again before installing.
#   up     Two containers of the image (--tag, default IMAGE:cpu), P-a (hostname nodea, address .2) and P-b
#          (nodeb, .3), on the podman network P-net (P defaults to hvt; a /24 that podman picks free, so that
#          several such pairs can run at once), each with the entry point's sshd (HVT_SSHD=1, SSH_PORT, default
#          12345) and a throwaway key pair made in $HVT_PODMAN_DIR/P-ssh mounted read-only at /root/.ssh; both have
#          each other in /etc/hosts. Then, e.g.:
#            podman exec P-a launch/horovodrun_multihost.sh -H nodea:1,nodeb:1 -- --config configs/demo.yaml
#
# Several runs at once (two checkouts' tests on one machine) share $HVT_PODMAN_DIR, the base image and the build
# cache: each file there is replaced in one rename (a build reading it sees the old or the new one), the base image
# is made under a lock, and what `up` creates is named by its prefix.
#
# Environment: HVT_PODMAN_DIR (state: conf, torch index; default ~/.cache/horovod-train/podman), HVT_IMAGE,
#   HVT_PYTHON (default: the checkout's .venv/bin/python), HVT_CA_BUNDLE (default: the host pip's cert),
#   HVT_TORCH_WHEEL (a torch CPU wheel file to use instead of `pip download`), HVT_GPU_INDEX_URL (where the GPU
#   variant's torch comes from; default https://pypi.org/simple), CONTAINERS_CONF.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${HVT_PODMAN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/horovod-train/podman}
BASE=localhost/debian:bookworm-slim
SUITE=bookworm
PY=${HVT_PYTHON:-$ROOT/.venv/bin/python}
IMAGE=${HVT_IMAGE:-localhost/horovod-train}
# The package's version, written in pyproject.toml alone (horovod_train.__version__ reads it from the metadata).
PACKAGE_VERSION=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' "$ROOT/pyproject.toml" | head -n 1)

# shellcheck source=launch/lib.sh
source "$ROOT/launch/lib.sh" # hvt_die

need() {
    command -v "$1" >/dev/null 2>&1 || hvt_die "$1 is not installed" "apt-get install $2"
}

# write_atomically FILE: stdin into FILE in one rename, so that a build reading FILE at the same time (another run on
# this machine) sees the old content or the new, never a part of it.
write_atomically() {
    local tmp
    tmp=$(mktemp "$1.XXXXXX")
    cat >"$tmp"
    chmod 644 "$tmp"
    mv -f "$tmp" "$1"
}

step_conf() {
    mkdir -p "$STATE"
    local conf=$STATE/containers.conf
    write_atomically "$conf" <<'EOF'
# Written by scripts/podman_build.sh.
[containers]
# Higher limits are refused by some kernels (EPERM on setrlimit inside the container).
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
# crun fails on kernels with hybrid cgroups; runc works everywhere.
runtime = "runc"
EOF
    if [ -z "${CONTAINERS_CONF:-}" ]; then
        export CONTAINERS_CONF=$conf
    fi
}

# The host's Debian apt sources (deb822 or one-line), so the base image installs from the same mirrors.
host_sources() {
    local file
    for file in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
        if [ -s "$file" ] && grep -q "$SUITE" "$file"; then
            echo "$file"
            return
        fi
    done
    echo "http://deb.debian.org/debian"
}

step_base() {
    need podman podman
    mkdir -p "$STATE"
    exec 8>"$STATE/base.lock" # another run making the base image at the same time: wait for it, then use its image
    flock -n 8 || { echo "[podman] waiting for another run to make $BASE" && flock 8; }
    if podman image exists "$BASE"; then
        echo "[podman] base image $BASE already there"
        exec 8>&-
        return
    fi
    need mmdebstrap mmdebstrap
    local work sources
    work=$(mktemp -d)
    # shellcheck disable=SC2064  # expand now: $work is local
    trap "rm -rf '$work'" RETURN
    sources=$(host_sources)
    echo "[podman] creating $BASE: mmdebstrap --variant=minbase $SUITE (apt sources: $sources)"
    mmdebstrap --quiet --variant=minbase --format=tar "$SUITE" "$work/rootfs.tar" "$sources"
    podman import --quiet --change 'CMD ["bash"]' "$work/rootfs.tar" "$BASE" >/dev/null
    echo "[podman] $BASE: $(podman image inspect --format '{{.Size}}' "$BASE") bytes"
    exec 8>&-
}

# Sets TORCH_DIR: a directory with index/torch/index.html and the wheel, to be mounted at /hvt-build.
step_torch_index() {
    [ -x "$PY" ] || hvt_die "no Python at $PY" "run 'make setup' or set HVT_PYTHON"
    local version wheel
    version=$("$PY" -c 'import torch; print(torch.__version__)')
    version=${version%%+*}+cpu # a CUDA torch here: the CPU build of the same version (then Horovod is compiled)
    TORCH_DIR=$STATE/build
    mkdir -p "$TORCH_DIR/wheels" "$TORCH_DIR/index/torch"
    if [ -n "${HVT_TORCH_WHEEL:-}" ]; then
        [ -f "$HVT_TORCH_WHEEL" ] || hvt_die "HVT_TORCH_WHEEL=$HVT_TORCH_WHEEL does not exist" "point it at a torch wheel"
        local copy
        copy=$TORCH_DIR/wheels/$(basename "$HVT_TORCH_WHEEL")
        cmp -s "$HVT_TORCH_WHEEL" "$copy" || write_atomically "$copy" <"$HVT_TORCH_WHEEL"
    elif ! ls "$TORCH_DIR"/wheels/torch-"$version"-*.whl >/dev/null 2>&1; then
        echo "[podman] fetching the torch $version wheel with the host's pip"
        # Into a directory of its own, then renamed in: another run's build may be reading the index's wheel.
        local download
        download=$(mktemp -d "$TORCH_DIR/wheels/.download.XXXXXX")
        # First as the host's pip is configured (its find-links, proxy, index), then from PyTorch's CPU index.
        "$PY" -m pip download -q --no-deps --only-binary :all: --retries 1 --timeout 20 -d "$download" \
            "torch==$version" 2>/dev/null ||
            "$PY" -m pip download -q --no-deps --only-binary :all: -d "$download" \
                --index-url https://download.pytorch.org/whl/cpu "torch==$version"
        mv -f "$download"/torch-*.whl "$TORCH_DIR/wheels/"
        rm -rf "$download"
    fi
    local -a found=("$TORCH_DIR"/wheels/torch-"$version"-*.whl)
    [ -f "${found[0]}" ] || hvt_die "no torch $version wheel in $TORCH_DIR/wheels" "set HVT_TORCH_WHEEL to a torch CPU wheel"
    wheel=$(basename "${found[0]}")
    printf '<a href="file:///hvt-build/wheels/%s">%s</a>\n' "${wheel//+/%2B}" "$wheel" |
        write_atomically "$TORCH_DIR/index/torch/index.html"
    step_pip_conf
}

# $TORCH_DIR/pip.conf, mounted at /etc/pip.conf in every RUN step.
step_pip_conf() {
    mkdir -p "$TORCH_DIR"
    # pip inside the build trusts the host pip's bundle (sites behind a TLS-inspecting proxy need exactly this).
    local ca=${HVT_CA_BUNDLE:-}
    if [ -z "$ca" ]; then
        ca=$("$PY" -m pip config list 2>/dev/null | sed -n "s/^[^=]*\.cert='\(.*\)'$/\1/p" | head -n1)
    fi
    {
        echo "[global]"
        if [ -n "$ca" ] && [ -f "$ca" ]; then
            write_atomically "$TORCH_DIR/ca-bundle.crt" <"$ca"
            echo "cert = /hvt-build/ca-bundle.crt"
        fi
    } | write_atomically "$TORCH_DIR/pip.conf"
}

# verified_wheel_digest DIR: DIR's Horovod wheel matches the SHA256SUMS scripts/build_horovod.sh recorded when it
# built it (a wheel cached before digests were recorded gets one now: it lies in this user's own cache).
verified_wheel_digest() {
    local -a wheels=("$1"/horovod-*.whl)
    [ "${#wheels[@]}" -eq 1 ] || hvt_die "$1 holds ${#wheels[@]} Horovod wheels" "remove $1 and run 'make setup' again"
    if ! [ -f "$1/SHA256SUMS" ]; then
        echo "[podman] recording the digest of ${wheels[0]} (built before digests were recorded)"
        (cd "$1" && sha256sum "$(basename "${wheels[0]}")" >SHA256SUMS)
    fi
    (cd "$1" && sha256sum --quiet --strict -c SHA256SUMS) ||
        hvt_die "${wheels[0]} does not match the digest recorded when it was built" "remove $1 and run 'make setup' again"
}

# private_dir DIR: DIR exists, it and everything in it are ours, and nobody else can write there (it lies in a
# world-writable directory, where another user could have made it first).
private_dir() {
    mkdir -p "$1"
    if [ -L "$1" ] || [ -n "$(find "$1" ! -user "$(id -u)" -print -quit)" ]; then
        hvt_die "$1 (or something in it) belongs to another user or is a link" "remove it, or set TMPDIR to a private directory"
    fi
    chmod -R go-w "$1"
}

# seed_wheel FROM TO: TO holds FROM's wheel and SHA256SUMS, checked there, and no other wheel. Each file is replaced
# in one rename: a build using the cache at the same time (another run on this machine) never sees a part of one.
seed_wheel() {
    local wheel staging
    wheel=$(basename "$1"/horovod-*.whl)
    staging=$(mktemp -d "$2/.seed.XXXXXX")
    cp "$1/$wheel" "$1/SHA256SUMS" "$staging/"
    if ! (cd "$staging" && sha256sum --quiet --strict -c SHA256SUMS); then
        rm -rf "$staging"
        hvt_die "the wheel copied to $2 does not match its digest" "check who else writes to ${TMPDIR:-/var/tmp}"
    fi
    find "$2" -maxdepth 1 -name 'horovod-*.whl' ! -name "$wheel" -delete
    mv -f "$staging/$wheel" "$staging/SHA256SUMS" "$2/"
    rmdir "$staging"
}

# --seed-horovod-wheel: put the host's cached wheel where the Dockerfile's cache mount
# (RUN --mount=type=cache,target=/root/.cache/horovod-train) finds it. Buildah keeps cache mounts without an
# id under $TMPDIR/buildah-cache[-<uid>]/<target>.
seed_horovod() {
    local host_cache=${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/horovod-train/wheels} key
    local cache dir keys=() found
    # shellcheck disable=SC1091
    if ! (. /etc/os-release && [ "${VERSION_CODENAME:-}" = "$SUITE" ]); then
        echo "[podman] warning: this host is not Debian $SUITE: not seeding its Horovod wheel (the build compiles one)"
        return
    fi
    # The keys scripts/build_horovod.sh uses: horovod-VERSION-torchVERSION-cudaCUDA-cpXY[-smARCHS], for the CPU
    # torch (`make setup`) and the CUDA one (`make nccl-build`) of requirements.txt's pin; the build picks its own.
    key=$("$PY" - <<'PY'
import sys, torch
print(f"horovod-0.28.1-torch{torch.__version__.split('+')[0]}_*-cp{sys.version_info[0]}{sys.version_info[1]}*")
PY
)
    for found in "$host_cache"/$key; do
        if ls "$found"/horovod-*.whl >/dev/null 2>&1; then
            verified_wheel_digest "$found"
            keys+=("$(basename "$found")")
        fi
    done
    if [ "${#keys[@]}" = 0 ]; then
        echo "[podman] warning: no $host_cache/$key (run 'make setup'): the build compiles Horovod"
        return
    fi
    # Buildah 1.28 (podman 4.3) as root uses buildah-cache, other versions and users buildah-cache-<uid>. They lie
    # in a world-writable directory ($TMPDIR, /var/tmp): whatever is there is replaced by the verified wheel and its
    # digest, in directories only we can write, and the build (scripts/build_horovod.sh) checks the digest again.
    for dir in buildah-cache buildah-cache-$(id -u); do
        cache=${TMPDIR:-/var/tmp}/$dir/root/.cache/horovod-train/wheels
        for key in "${keys[@]}"; do
            mkdir -p "$cache/$key"
            private_dir "${TMPDIR:-/var/tmp}/$dir"
            seed_wheel "$host_cache/$key" "$cache/$key"
        done
    done
    echo "[podman] seeded the build cache with ${keys[*]} from $host_cache"
}

step_build() {
    local variant=cpu seed=0 tag
    local -a tags=() tag_args=() variant_args
    while [ "$#" -gt 0 ]; do
        case $1 in
        --tag)
            [ "$#" -ge 2 ] || hvt_die "--tag needs a value" "pass --tag localhost/horovod-train:cpu"
            tags+=("$2")
            shift 2
            ;;
        --variant)
            if [ "$#" -lt 2 ] || ! [[ $2 =~ ^(cpu|gpu)$ ]]; then
                hvt_die "--variant needs cpu or gpu" "pass --variant gpu"
            fi
            variant=$2
            shift 2
            ;;
        --seed-horovod-wheel)
            seed=1
            shift
            ;;
        --)
            shift
            break
            ;;
        *) hvt_die "unknown option '$1'" "see the usage at the top of scripts/podman_build.sh" ;;
        esac
    done
    [ -n "$PACKAGE_VERSION" ] || hvt_die "no version = \"...\" in $ROOT/pyproject.toml" "restore pyproject.toml's version line"
    [ "${#tags[@]}" -gt 0 ] || tags=("$IMAGE:$variant" "$IMAGE:$PACKAGE_VERSION-$variant")
    for tag in "${tags[@]}"; do tag_args+=(-t "$tag"); done
    step_base
    if [ "$variant" = cpu ]; then
        step_torch_index
        variant_args=(--build-arg TORCH_INDEX_URL=file:///hvt-build/index)
    else
        TORCH_DIR=$STATE/build
        step_pip_conf
        # PyPI's torch for Linux x86_64 is the CUDA 13 build; CUDA_TOOLKIT=auto adds nvcc at its CUDA.
        variant_args=(--build-arg "TORCH_INDEX_URL=${HVT_GPU_INDEX_URL:-https://pypi.org/simple}"
            --build-arg CUDA_TOOLKIT=auto)
    fi
    [ "$seed" = 0 ] || seed_horovod
    local cmd=(podman build --format docker -f "$ROOT/docker/Dockerfile" "${tag_args[@]}"
        --build-arg BASE_IMAGE=debian:bookworm-slim "${variant_args[@]}"
        --volume "$TORCH_DIR:/hvt-build:ro"
        --volume "$TORCH_DIR/pip.conf:/etc/pip.conf:ro"
        "$@" "$ROOT")
    echo "+ CONTAINERS_CONF=$CONTAINERS_CONF ${cmd[*]}"
    "${cmd[@]}"
}

step_up() {
    local prefix=hvt tag=$IMAGE:cpu port=12345 host ip keys subnet net
    local -a volumes=()
    while [ "$#" -gt 0 ]; do
        [ "$#" -ge 2 ] || hvt_die "$1 needs a value" "see the usage at the top of scripts/podman_build.sh"
        case $1 in
        --prefix) prefix=$2 ;;
        --tag) tag=$2 ;;
        --ssh-port) port=$2 ;;
        --volume) volumes+=(--volume "$2") ;;
        *) hvt_die "unknown option '$1'" "see the usage at the top of scripts/podman_build.sh" ;;
        esac
        shift 2
    done
    need podman podman
    podman image exists "$tag" || hvt_die "no image $tag" "run scripts/podman_build.sh build first"
    step_down "$prefix"
    keys=$STATE/$prefix-ssh
    mkdir -p "$keys" && chmod 700 "$keys"
    ssh-keygen -q -t ed25519 -N '' -C "$prefix" -f "$keys/id_ed25519"
    cp "$keys/id_ed25519.pub" "$keys/authorized_keys"
    chmod 600 "$keys"/*
    # No --subnet: podman picks a free one (under its own lock), so that another pair (another prefix) can run too.
    podman network create "$prefix-net" >/dev/null
    subnet=$(podman network inspect --format '{{range .Subnets}}{{.Subnet}}{{end}}' "$prefix-net")
    [[ $subnet =~ ^([0-9]+\.[0-9]+\.[0-9]+)\.0/24$ ]] ||
        hvt_die "podman gave $prefix-net the subnet '$subnet', not a /24" "set default_subnet_pools in containers.conf to /24s"
    net=${BASH_REMATCH[1]}
    for host in a b; do
        ip=$net.$([ "$host" = a ] && echo 2 || echo 3)
        podman run -d --name "$prefix-$host" --hostname "node$host" --network "$prefix-net" --ip "$ip" \
            --add-host "nodea:$net.2" --add-host "nodeb:$net.3" \
            -e HVT_SSHD=1 -e SSH_PORT="$port" -v "$keys:/root/.ssh:ro" "${volumes[@]}" \
            "$tag" sleep infinity >/dev/null
    done
    # sshd is up once the entry point has said so, on both.
    for host in a b; do
        for _ in $(seq 100); do
            podman logs "$prefix-$host" 2>&1 | grep -q 'sshd listening' && break
            sleep 0.2
        done
    done
    podman exec "$prefix-a" ssh nodeb hostname >/dev/null ||
        hvt_die "no ssh from $prefix-a to nodeb" "see 'podman logs $prefix-b'"
    echo "[podman] $prefix-a (nodea) and $prefix-b (nodeb) up on $prefix-net ($subnet), sshd on port $port"
}

step_down() {
    local prefix=${1:-hvt}
    podman rm -f -t 0 "$prefix-a" "$prefix-b" >/dev/null 2>&1 || true
    podman network rm -f "$prefix-net" >/dev/null 2>&1 || true
    rm -rf "${STATE:?}/$prefix-ssh"
}

what=${1:-build}
[ "$#" -eq 0 ] || shift
step_conf
case $what in
conf) echo "$CONTAINERS_CONF" ;;
base) step_base ;;
seed) seed_horovod ;;
build) step_build "$@" ;;
up) step_up "$@" ;;
down)
    [ "${1:-}" != --prefix ] || shift
    step_down "${1:-hvt}"
    ;;
*) hvt_die "unknown command '$what'" "pass build, base, conf, seed, up or down" ;;
esac
