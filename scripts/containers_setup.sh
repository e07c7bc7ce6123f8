#!/usr/bin/env bash
# Container tooling for the container tests and `make image` on a Debian 12 host, as root; idempotent.
#
#   scripts/containers_setup.sh [PYTHON]      # `make containers-setup` passes the venv's python
#
# 1. podman + runc + debootstrap from Debian's packages (no Docker daemon, no image registry needed).
# 2. containers.conf: runtime runc and no default ulimits (crun fails on hybrid cgroups and rlimits here);
#    netavark networks (name resolution between containers).
# 3. podman-compose, kubernetes-validate and the Kubernetes client from PyPI into PYTHON's environment.
# 4. The local Debian base image (debootstrap minbase bookworm, `podman import`): built once, kept while it exists.
# Each step is skipped when its result is already there. Not root, or not Debian: says so and exits 0, so the
# container tests skip with their one-line reason instead of the whole CI failing.
set -euo pipefail

PYTHON=${1:-python3}
BASE_IMAGE=${SPLITSERVE_BASE_IMAGE:-localhost/splitserve-base:bookworm}
SUITE=bookworm
PODMAN_COMPOSE=podman-compose==1.6.0
KUBERNETES_VALIDATE=kubernetes-validate==1.37.0
KUBERNETES=kubernetes==37.0.2
CONF=/etc/containers/containers.conf

step() { printf '[containers-setup %3ss] %s\n' "$SECONDS" "$*"; }

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "containers-setup: needs root on Debian (apt-get); skipped, container tests will skip" >&2
  exit 0
fi

missing=()
# netavark + aardvark-dns: compose service names resolve between containers (CNI alone has no DNS here);
# catatonit: compose's `init: true`; iptables: netavark runs it to set up every network, a build's RUN steps
# included ("netavark: No such file or directory" without it; only a Recommends of Debian's podman).
for pkg in podman runc debootstrap netavark aardvark-dns catatonit uidmap slirp4netns fuse-overlayfs iptables; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Only the settings we need; a containers.conf someone else wrote is left alone when it already has them.
if ! grep -qs '^runtime *= *"runc"' "$CONF" || ! grep -qs '^default_ulimits *= *\[\]' "$CONF" \
    || ! grep -qs '^network_backend *= *"netavark"' "$CONF"; then
  step "write $CONF"
  mkdir -p "$(dirname "$CONF")"
  [ -f "$CONF" ] && cp "$CONF" "$CONF.before-splitserve"
  cat > "$CONF" <<'CONFEOF'
# Written by splitserve's scripts/containers_setup.sh: crun fails on this kind of host (hybrid cgroups, rlimits).
[containers]
default_ulimits = []

[engine]
runtime = "runc"

[network]
network_backend = "netavark"
CONFEOF
fi

if ! "$PYTHON" -c "import kubernetes_validate, kubernetes, podman_compose" 2>/dev/null; then
  step "pip install $PODMAN_COMPOSE $KUBERNETES_VALIDATE $KUBERNETES"
  "$PYTHON" -m pip install -q "$PODMAN_COMPOSE" "$KUBERNETES_VALIDATE" "$KUBERNETES"
fi

if podman image exists "$BASE_IMAGE"; then
  step "base image $BASE_IMAGE present"
else
  step "debootstrap --variant=minbase $SUITE, podman import $BASE_IMAGE"
  root=$(mktemp -d /var/tmp/splitserve-base.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  # mktemp makes it 0700, and the tar below carries that mode to the image's /: podman lets the image's non-root
  # user through anyway, Docker does not ("stat /bin/ls: permission denied").
  chmod 0755 "$root"
  # python3 + venv: bookworm's python is 3.11, the version the project's wheels are pinned for.
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,libnuma1 \
    "$SUITE" "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >/dev/null
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  # podman import sets no environment: PATH as Debian's images have it.
  tar -C "$root" -c . | podman import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
fi
step "done: $(podman --version), runtime $(podman info --format '{{.Host.OCIRuntime.Name}}'), base $BASE_IMAGE"
