#!/usr/bin/env bash
# Builds the CPU container image (deploy/docker/Dockerfile.cpu) with podman,
# on Debian 12 as root, without a container registry:
#   1. installs podman, runc and debootstrap (Debian's packages);
#   2. where this machine needs it, a containers.conf drop-in (below);
#   3. when podman has no image debian:bookworm-slim (the Dockerfile's FROM),
#      makes one as Debian makes its own: debootstrap --variant=minbase from
#      the Debian mirror apt uses here, without docs, man pages and locales.
#      Its tarball stays in $FERRUM_IMAGE_CACHE (/var/cache/ferrum-image), so
#      that another run imports it in seconds. podman imports it as
#      localhost/debian:bookworm-slim, which the short name in FROM finds
#      before any registry;
#   4. podman build (docker format, which keeps HEALTHCHECK), never pulling;
#   5. prints the image's size and the time each step took.
#   --tag NAME     the image's name (default ferrum:cpu)
#   --fresh-base   remove the image NAME, debootstrap a new base even when
#                  one is there (CI: the run does all a fresh machine does)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tag=ferrum:cpu
fresh=0
while [ $# -gt 0 ]; do
  case $1 in
    --tag) tag=${2:?--tag needs a name}; shift 2 ;;
    --fresh-base) fresh=1; shift ;;
    *) echo "usage: deploy/image.sh [--tag NAME] [--fresh-base]" >&2; exit 2 ;;
  esac
done
base=debian:bookworm-slim
cache=${FERRUM_IMAGE_CACHE:-/var/cache/ferrum-image}
note() { echo "image: $*" >&2; }
die() { note "$*"; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (apt-get, debootstrap, rootful podman)"

# 1. Packages.
t0=$SECONDS
missing=()
for p in podman runc debootstrap; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  note "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. This machine's quirks, each fixed only where it is found:
#  - cgroups v1 with a cgroup2 hierarchy beside it that holds a controller
#    ("hybrid"): crun refuses to create a container ("cgroups in hybrid
#    mode not supported"); runc runs it.
#  - root without CAP_SYS_RESOURCE: podman asks for RLIMIT_NOFILE and
#    RLIMIT_NPROC of 1048576 in every container, more than such a root may
#    set ("setrlimit RLIMIT_NOFILE: Operation not permitted"); the drop-in
#    asks for the hard limits this shell has (nproc also at most pid_max).
conf=/etc/containers/containers.conf.d/ferrum-host.conf
runtime= ulimits=
if [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ] && grep -qs . /sys/fs/cgroup/unified/cgroup.controllers; then
  runtime=runc
fi
capeff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
if [ $(((16#$capeff >> 24) & 1)) = 0 ]; then # CAP_SYS_RESOURCE is bit 24
  nofile=$(ulimit -Hn) nproc=$(ulimit -Hu) pidmax=$(cat /proc/sys/kernel/pid_max)
  if [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pidmax" ]; then nproc=$pidmax; fi
  if [ "$nofile" = unlimited ]; then nofile=1048576; fi
  ulimits="\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\""
fi
if [ -n "$runtime$ulimits" ]; then
  mkdir -p "$(dirname "$conf")"
  {
    echo "# Written by ferrum's deploy/image.sh for this machine (see its step 2)."
    [ -z "$ulimits" ] || printf '[containers]\ndefault_ulimits = [%s]\n' "$ulimits"
    [ -z "$runtime" ] || printf '[engine]\nruntime = "%s"\n' "$runtime"
  } >"$conf.tmp"
  if cmp -s "$conf.tmp" "$conf"; then rm "$conf.tmp"; else mv "$conf.tmp" "$conf" && note "wrote $conf"; fi
fi
t1=$SECONDS

# 3. The base image.
# base_cleanup DIR: unmounts what is mounted under DIR, then removes it.
base_cleanup() {
  { findmnt -Rrn -o TARGET "$1" || true; } | sort -r | xargs -r umount -l
  rm -rf --one-file-system "$1"
}

# make_base TARBALL: a bookworm minbase root file system as a tarball.
make_base() {
  local out=$1 mirror security rootfs
  # The Debian mirror (and security mirror) of apt's own sources.
  mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' |
    awk '$2 == "bookworm" {print $1; exit}')
  security=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' |
    awk '$2 == "bookworm-security" {print $1; exit}')
  [ -n "$mirror" ] || die "apt has no Debian bookworm source to debootstrap from"
  rootfs=$(mktemp -d /var/tmp/ferrum-base.XXXXXX)
  # debootstrap mounts /proc and /sys inside; a failed run may leave them.
  trap 'base_cleanup "'"$rootfs"'"' EXIT
  note "debootstrap bookworm (minbase) from $mirror"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 ||
    { tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; die "debootstrap failed"; }
  rm -f "$rootfs.log"
  # What Debian's slim image holds besides: bookworm's updates and security
  # sources, and no docs, man pages or locales, now or from later installs.
  {
    printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: main\n' "$mirror"
    printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    if [ -n "$security" ]; then
      printf '\nTypes: deb\nURIs: %s\nSuites: bookworm-security\nComponents: main\n' "$security"
      printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    fi
  } >"$rootfs/etc/apt/sources.list.d/debian.sources"
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$rootfs/etc/apt/apt.conf.d/docker-no-recommends"
  (cd "$rootfs" && find usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete &&
    rm -rf usr/share/groff/* usr/share/info/* usr/share/locale/* usr/share/man/* \
      var/cache/apt/archives/*.deb var/cache/apt/*.bin var/lib/apt/lists/* var/log/*.log \
      etc/hostname etc/resolv.conf) # the container runtime provides these two
  mkdir -p "$(dirname "$out")"
  tar --numeric-owner --xattrs -C "$rootfs" -cf "$out.part" . && mv "$out.part" "$out"
  base_cleanup "$rootfs"
  trap - EXIT
}

tarball=$cache/debian-bookworm-slim.tar
# A fresh run keeps no image of an earlier one: a failed build leaves none.
if [ $fresh = 1 ] && podman image exists "$tag"; then podman image rm -f "$tag" >/dev/null; fi
if [ $fresh = 1 ] || ! podman image exists "$base"; then
  if [ $fresh = 1 ] || [ ! -s "$tarball" ]; then
    make_base "$tarball"
  else
    note "base from $tarball"
  fi
  podman import --quiet --change 'CMD ["bash"]' "$tarball" "$base" >/dev/null
  # The images of the previous base, now untagged, and what was built on it.
  podman image prune -f >/dev/null
fi
note "base $(podman image inspect --format '{{.Id}}' "$base" | cut -c1-12) as $base"
t2=$SECONDS

# 4. The image. The build's RUN steps reach the Debian mirror through the
# host's network (no CNI plugin needed).
note "building $tag from deploy/docker/Dockerfile.cpu"
podman build --pull=never --format docker --network host \
  -f "$root/deploy/docker/Dockerfile.cpu" -t "$tag" "$root"
t3=$SECONDS

# 5. What it made.
size=$(podman image inspect --format '{{.Size}}' "$tag")
note "$tag: $((size / 1000000)) MB; packages $((t1 - t0)) s, base $((t2 - t1)) s, build $((t3 - t2)) s"
