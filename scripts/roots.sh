# Sourced by scripts/brokers.sh and scripts/rabbitmq: brokers newer than the
# machine's own, from Debian's packages, in minimal Debian roots kept in a
# cache directory (made once per machine, reused, made again when missing or
# half made).
#
#   RabbitMQ 4.3 and nats-server 2.15    Debian sid     (rabbitmq-server 4.3.x, nats-server 2.15.x)
#   RabbitMQ 4.0 and nats-server 2.10    Debian trixie  (rabbitmq-server 4.0.x, nats-server 2.10.x)
#
# A broker runs from its root with `chroot`, under the root's own users and
# Erlang (so its own Erlang cookie), with its own epmd port. The machine's
# temporary directory is bind-mounted at the same path inside the root, so a
# node directory under it has one path seen from both sides; /proc is mounted
# for the Erlang VM. Needs root.

HOURGLASS_ROOTS="${HOURGLASS_ROOTS:-${HOURGLASS_CACHE:-$HOME/.cache/hourglass}/roots}"

# The Debian suite that carries RabbitMQ VERSION (4.0, 4.3); fails for others.
rabbitmq_suite() {
  case "$1" in
    4.3) echo sid ;;
    4.0) echo trixie ;;
    *) echo "error: no Debian root carries RabbitMQ $1 (known: 4.0, 4.3; 3.10 is the machine's own)" >&2; return 1 ;;
  esac
}

# The Debian suite that carries nats-server VERSION (2.10, 2.15); fails for others.
nats_suite() {
  case "$1" in
    2.15) echo sid ;;
    2.10) echo trixie ;;
    *) echo "error: no NATS server $1 here (known: 2.9, the machine's own; 2.10 and 2.15 from Debian roots)" >&2; return 1 ;;
  esac
}

# The epmd port of the nodes run from SUITE's root: never the machine's 4369,
# whose epmd belongs to another Erlang.
root_epmd_port() {
  case "$1" in
    sid) echo 4380 ;;
    trixie) echo 4381 ;;
  esac
}

# The Debian mirror this machine's apt uses (the first URIs: line), else Debian's own.
debian_mirror() {
  local uri
  uri=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

# Prints the path of SUITE's root, making it first when it is missing. Two
# scripts asking at once (CI runs the fault suite and the soak together) take
# turns on a lock; the second finds the root made.
debian_root() {
  local suite=$1 root="$HOURGLASS_ROOTS/$1"
  mkdir -p "$HOURGLASS_ROOTS"
  (
    flock 9
    if [ ! -e "$root/.hourglass-root-ready" ]; then
      make_debian_root "$suite" "$root" >&2 || exit 1
    fi
    mount_root "$root"
  ) 9>"$HOURGLASS_ROOTS/.lock" || return 1
  echo "$root"
}

make_debian_root() {
  local suite=$1 root=$2 partial="$2.partial"
  if ! command -v debootstrap >/dev/null 2>&1; then
    echo "installing debootstrap with apt (to make a Debian $suite root for the newer brokers)"
    if ! { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null; }; then
      echo "error: could not install debootstrap: apt-get install debootstrap" >&2
      return 1
    fi
  fi
  unmount_root "$partial"
  if findmnt -rn -o TARGET | grep -q "^$partial"; then
    echo "error: something is still mounted under $partial; unmount it, then run again" >&2
    return 1
  fi
  rm -rf "$partial"
  echo "making a Debian $suite root in $root for its rabbitmq-server and nats-server (about a minute, once per machine)"
  if ! debootstrap --variant=minbase "$suite" "$partial" "$(debian_mirror)" >"$HOURGLASS_ROOTS/$suite.debootstrap.log" 2>&1; then
    echo "error: debootstrap $suite failed; see $HOURGLASS_ROOTS/$suite.debootstrap.log" >&2
    return 1
  fi
  # Packages install without starting services; the node needs the machine's
  # hosts file, or it hangs in rabbitmq_prelaunch resolving its own name.
  printf '#!/bin/sh\nexit 101\n' >"$partial/usr/sbin/policy-rc.d"
  chmod +x "$partial/usr/sbin/policy-rc.d"
  cp /etc/hosts "$partial/etc/hosts"
  if ! chroot "$partial" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends rabbitmq-server nats-server \
    >"$HOURGLASS_ROOTS/$suite.install.log" 2>&1; then
    echo "error: installing rabbitmq-server and nats-server in the $suite root failed; see $HOURGLASS_ROOTS/$suite.install.log" >&2
    return 1
  fi
  touch "$partial/.hourglass-root-ready"
  mv "$partial" "$root"
}

mount_root() {
  local root=$1 tmp
  tmp=$(realpath "${TMPDIR:-/tmp}")
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  mkdir -p "$root$tmp"
  mountpoint -q "$root$tmp" || mount --bind "$tmp" "$root$tmp"
}

unmount_root() {
  local root=$1 tmp
  tmp=$(realpath "${TMPDIR:-/tmp}")
  [ -d "$root" ] || return 0
  mountpoint -q "$root$tmp" 2>/dev/null && umount "$root$tmp"
  mountpoint -q "$root/proc" 2>/dev/null && umount "$root/proc"
  return 0
}
