#!/usr/bin/env bash
# Several "hosts" on one machine for real multi-host mpirun runs: each host is a network namespace
# with its own address on a bridge (veth pairs) and its own hostname (a UTS namespace), running its
# own sshd; all share the filesystem.
#   scripts/netns-hosts.sh up N DIR    N hosts mt-h0..; writes DIR/hostfile (DeepSpeed format,
#                                      `10.77.0.1X slots=S`, S = MT_SLOTS or 2) and DIR/env: the
#                                      OMPI_MCA_* settings mpirun needs (ssh with DIR's key, TCP on
#                                      the bridge); `source DIR/env` before `meshtrain launch`
#   scripts/netns-hosts.sh down DIR    stops the sshds and removes the namespaces and the bridge
#   scripts/netns-hosts.sh pids I      the meshtrain processes running on host I
# Exit 77 when this machine cannot make namespaces (not root, no CAP_SYS_ADMIN, no sshd): callers
# skip. Needs iproute2 and openssh-server (scripts/install-deps.sh).
set -euo pipefail

BR=mt-br0
NET=10.77.0

unavailable() {
  echo "netns-hosts: $*" >&2
  exit 77
}

cmd=${1:-}
case "$cmd" in
up)
  n=${2:?usage: netns-hosts.sh up N DIR}
  dir=${3:?usage: netns-hosts.sh up N DIR}
  slots=${MT_SLOTS:-2}
  [ "$(id -u)" -eq 0 ] || unavailable "needs root (network namespaces)"
  command -v ip >/dev/null || unavailable "no ip (iproute2)"
  [ -x /usr/sbin/sshd ] || unavailable "no /usr/sbin/sshd (openssh-server)"
  command -v ssh >/dev/null || unavailable "no ssh client"
  "$0" down "$dir" >/dev/null 2>&1 || true
  ip netns add mt-probe 2>/dev/null || unavailable "cannot create a network namespace here"
  ip netns del mt-probe
  mkdir -p "$dir" /run/sshd
  dir=$(cd "$dir" && pwd)
  rm -f "$dir/id" "$dir/id.pub" "$dir/host_key" "$dir/host_key.pub"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/id"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
  cp "$dir/id.pub" "$dir/authorized_keys"
  chmod 600 "$dir/authorized_keys"
  cat >"$dir/ssh_config" <<EOF
Host $NET.*
  IdentityFile $dir/id
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
EOF
  ip link add $BR type bridge
  ip addr add $NET.1/24 dev $BR
  ip link set $BR up
  : >"$dir/hostfile"
  for ((i = 0; i < n; i++)); do
    ns=mt-h$i addr=$NET.$((10 + i))
    ip netns add $ns
    ip link add mt-v$i type veth peer name eth0 netns $ns
    ip link set mt-v$i master $BR up
    ip netns exec $ns ip link set lo up
    ip netns exec $ns ip addr add $addr/24 dev eth0
    ip netns exec $ns ip link set eth0 up
    cat >"$dir/sshd_config.$i" <<EOF
ListenAddress $addr
HostKey $dir/host_key
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
StrictModes no
UsePAM no
PidFile $dir/sshd.$i.pid
AcceptEnv OMPI_* MT_*
EOF
    # Its own hostname too (a UTS namespace): OpenMPI names its per-node session directory (and
    # the shared-memory segments in it) by hostname, so hosts must not share one.
    ip netns exec $ns unshare --uts sh -c "hostname $ns && exec /usr/sbin/sshd -f '$dir/sshd_config.$i'"
    echo "$addr slots=$slots" >>"$dir/hostfile"
  done
  # mpirun (here, on the bridge's address) reaches every host by ssh with this key; its daemons
  # and the ranks talk TCP over the bridge.
  cat >"$dir/env" <<EOF
export OMPI_MCA_plm_rsh_args="-F $dir/ssh_config"
export OMPI_MCA_oob_tcp_if_include=$NET.0/24
export OMPI_MCA_btl_tcp_if_include=$NET.0/24
export OMPI_MCA_btl=self,vader,tcp
EOF
  for ((i = 0; i < n; i++)); do
    for t in $(seq 50); do
      ssh -F "$dir/ssh_config" $NET.$((10 + i)) true 2>/dev/null && break
      [ "$t" -lt 50 ] || unavailable "sshd on $NET.$((10 + i)) does not answer"
      sleep 0.1
    done
  done
  echo "netns-hosts: $n hosts up: $(awk '{print $1}' "$dir/hostfile" | tr '\n' ' ')"
  ;;
down)
  dir=${2:?usage: netns-hosts.sh down DIR}
  for p in "$dir"/sshd.*.pid; do
    [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true
  done
  for ns in $(ip netns list 2>/dev/null | awk '/^mt-h[0-9]+/ {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns"
  done
  ip link del $BR 2>/dev/null || true
  ;;
pids)
  i=${2:?usage: netns-hosts.sh pids I}
  for pid in $(ip netns pids mt-h$i 2>/dev/null); do
    exe=$(readlink /proc/$pid/exe 2>/dev/null || true)
    case "$exe" in */meshtrain) echo "$pid" ;; esac
  done
  ;;
*)
  echo "usage: netns-hosts.sh up N DIR | down DIR | pids I" >&2
  exit 2
  ;;
esac
