#!/usr/bin/env bash
# A container engine for the tests of swebench's Docker backend and compose.yaml (tests/test_containers.py,
# tests/test_compose_up.py), on a host without Docker: Debian's podman serving the Docker Engine API on
# /run/podman/podman.sock, and a small local base image, localhost/gymfleet-base:bookworm (Debian minbase with
# Debian's python3, venv, git and bubblewrap), built from Debian's package mirror (no container registry needed).
#
# Idempotent and quick when done: the engine is installed once, its two settings are written only where this host
# needs them, the API service is started only when its socket does not answer, and the image is rebuilt only when
# its recipe (below) changes (the recipe's hash is the image's label gymfleet.recipe).
#
# With DOCKER_HOST set (your own Docker or Podman), none of this runs: the tests use that engine, and its images.
set -euo pipefail
if [ -n "${DOCKER_HOST:-}" ]; then
    echo "DOCKER_HOST=$DOCKER_HOST: using that engine; nothing to install" >&2
    exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
SOCKET=/run/podman/podman.sock
IMAGE=localhost/gymfleet-base:bookworm
CONF=/etc/containers/containers.conf
SUITE=bookworm
PACKAGES=python3,python3-venv,git,bubblewrap,ca-certificates

# 1. podman (its runc runtime, and debootstrap for the base image).
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
    $SUDO apt-get install -y -q podman runc debootstrap >/dev/null 2>&1 \
        || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q podman runc debootstrap >/dev/null; }
fi
command -v podman >/dev/null || { echo "could not install podman (apt-get install podman runc debootstrap)" >&2; exit 1; }

# Adds `key = value` under [section] of containers.conf unless the key is set there already.
set_conf() {
    local section=$1 key=$2 value=$3
    $SUDO mkdir -p "$(dirname "$CONF")"
    [ -f "$CONF" ] || $SUDO touch "$CONF"
    grep -qE "^[[:space:]]*$key[[:space:]]*=" "$CONF" && return 0
    if grep -qE "^\[$section\][[:space:]]*$" "$CONF"; then
        $SUDO sed -i "/^\[$section\][[:space:]]*$/a $key = $value" "$CONF"
    else
        printf '\n[%s]\n%s = %s\n' "$section" "$key" "$value" | $SUDO tee -a "$CONF" >/dev/null
    fi
    echo "containers.conf: [$section] $key = $value" >&2
}

# 2. The base image, from Debian's mirror (the one apt uses), keyed by its recipe.
MIRROR=$(grep -hoE '^URIs: *[^ ]+' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1 | awk '{print $2}')
[ -n "$MIRROR" ] || MIRROR=$(grep -hoE '^deb +[^ ]+' /etc/apt/sources.list 2>/dev/null | head -1 | awk '{print $2}')
[ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
RECIPE=$(printf 'v1 %s %s minbase /workspace' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-16)
if [ "$($SUDO podman image inspect --format '{{index .Labels "gymfleet.recipe"}}' "$IMAGE" 2>/dev/null)" != "$RECIPE" ]; then
    started=$(date +%s)
    ROOTFS=$(mktemp -d /var/tmp/gymfleet-rootfs.XXXXXX)
    trap '$SUDO rm -rf "$ROOTFS"' EXIT
    $SUDO debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >/dev/null
    $SUDO mkdir -p "$ROOTFS/workspace"
    $SUDO rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
    $SUDO tar -C "$ROOTFS" -c . | $SUDO podman import \
        --change 'CMD ["python3"]' --change "LABEL gymfleet.recipe=$RECIPE" --change 'WORKDIR /workspace' \
        --change 'ENV LANG=C.UTF-8' - "$IMAGE" >/dev/null
    $SUDO rm -rf "$ROOTFS"
    trap - EXIT
    echo "built $IMAGE in $(( $(date +%s) - started ))s" >&2
fi

# 3. The two settings, only where running a container needs them: runc where crun refuses this host's cgroup
#    layout, and no default rlimits where the host refuses podman's ("error setting rlimit type 7").
for _ in 1 2 3; do
    if out=$($SUDO podman run --rm --network none "$IMAGE" true 2>&1); then
        break
    fi
    if grep -q "rlimit" <<<"$out"; then
        set_conf containers default_ulimits "[]"
    elif grep -qiE "crun|cgroup" <<<"$out" && ! grep -qE '^[[:space:]]*runtime[[:space:]]*=' "$CONF" 2>/dev/null; then
        set_conf engine runtime '"runc"'
    else
        echo "podman cannot run a container here: $out" >&2
        exit 1
    fi
done
$SUDO podman run --rm --network none "$IMAGE" true

# 4. The Docker-API service on $SOCKET (for the docker SDK and docker-compose), started when it does not answer.
answers() { python3 - "$SOCKET" <<'EOF'
import socket, sys
try:
    s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
    s.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n"); sys.exit(0 if b" 200 " in s.recv(200) else 1)
except OSError:
    sys.exit(1)
EOF
}
if ! answers; then
    $SUDO mkdir -p "$(dirname "$SOCKET")"
    $SUDO rm -f "$SOCKET"
    # From /var/tmp: conmon leaves an `oom` file in the service's working directory when a container is OOM-killed.
    (cd /var/tmp && $SUDO setsid nohup podman system service --time=0 "unix://$SOCKET" \
        >/var/tmp/gymfleet-podman-service.log 2>&1 < /dev/null &)
    for _ in $(seq 1 100); do answers && break; sleep 0.2; done
    answers || { echo "the podman API service did not answer on $SOCKET (log: /var/tmp/gymfleet-podman-service.log)" >&2; exit 1; }
fi
