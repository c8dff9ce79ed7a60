#!/usr/bin/env bash
# A multi-node Slurm cluster on this machine, one Linux network namespace per node, for the `cluster` stack.
#   scripts/local-cluster.sh start [--nodes N]   make what is missing, start what is stopped, wait until idle
#   scripts/local-cluster.sh stop                end what this script started (its pid files and namespaces)
#   scripts/local-cluster.sh status              daemons, namespaces, sinfo
#   scripts/local-cluster.sh lose-node NAME      kill a worker node: its slurmd and every process in it
#   start --serving-nodes K                      reserve the last K nodes for serving (kept across starts; 0 undoes):
#                                                partition `main` over the others and `serve` over them, beside
#                                                the default partition `cluster` over every node (the stack's
#                                                serving.nodes, as Soperator's structured partitions make them)
#   start --suspend-time S                       Slurm power saving (S > 0; 0 turns it off; kept across starts):
#                                                idle nodes power down after S seconds, a job powers them up
#   scripts/local-cluster.sh power-down|power-up HOSTLIST   what Slurm's SuspendProgram/ResumeProgram run: stop or
#                                                start each node's slurmd in its namespaces (Soperator's ephemeral
#                                                nodes stop and start the node's slurmd pod the same way)
#
# Layout (addresses on a private bridge made for the cluster; nothing else is ever contacted, no route leaves it):
#   <subnet>.1   the bridge, this machine's side (tests and ftstack reach the login node from here)
#   <subnet>.2   <prefix>-ctl    slurmctld; Prometheus on <subnet>.2:9090 scraping every node's exporter
#   <subnet>.3   <prefix>-login  sshd (host key generated for the cluster), sbatch/squeue/... for ftstack
#   <subnet>.11+ <prefix>-n1..N  slurmd, one per node (own NodeName, spool, log, pid), CPUs = cores / N;
#                                prometheus-node-exporter on :9100 reading <dir>/monitoring/textfile/<node>, the
#                                folder a TaskProlog gives the node's jobs for their metrics (an Epilog cleans up)
# Each node also has its own UTS namespace (hostname = node name) and mount namespace in which the cluster's
# hosts file is /etc/hosts, its config folder is /etc/slurm and the jail (<dir>/jail on this machine's shared
# filesystem) is mounted at /run/<prefix>/jail: the stack's jail root. One munged (socket under <dir>/munge)
# serves every node. Needs root (network namespaces), iproute2, openssh-server, slurm-wlm, munge, prometheus and
# prometheus-node-exporter. The Prometheus URL is written to <dir>/monitoring/prometheus.url.
# Environment: LOCAL_CLUSTER_DIR (default <repo>/.local/cluster), LOCAL_CLUSTER_PREFIX (default ftc; names of
# namespaces, bridge and nodes), LOCAL_CLUSTER_SUBNET (default 10.213.0, a /24), LOCAL_CLUSTER_CTLD_PORT (6990),
# LOCAL_CLUSTER_SLURMD_PORT (6991), LOCAL_CLUSTER_HIDDEN_MIRRORS (this machine's package folders hidden from the
# nodes; default /opt/pypi /opt/pypi-more /opt/wheels). Clients on this machine: export SLURM_CONF=<dir>/etc/slurm.conf
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BASE="${LOCAL_CLUSTER_DIR:-$ROOT/.local/cluster}"
PREFIX="${LOCAL_CLUSTER_PREFIX:-ftc}"
SUBNET="${LOCAL_CLUSTER_SUBNET:-10.213.0}"
CTLD_PORT="${LOCAL_CLUSTER_CTLD_PORT:-6990}"
SLURMD_PORT="${LOCAL_CLUSTER_SLURMD_PORT:-6991}"
# shellcheck source=scripts/slurm-common.sh
. "$ROOT/scripts/slurm-common.sh"
# shellcheck source=scripts/monitoring-common.sh
. "$ROOT/scripts/monitoring-common.sh"
MON="$BASE/monitoring"
LOGIN="$BASE/login"
JAIL="$BASE/jail"
JAIL_MOUNT="/run/$PREFIX/jail"
LOCAL_MIRRORS="${LOCAL_CLUSTER_HIDDEN_MIRRORS:-/opt/pypi /opt/pypi-more /opt/wheels}"
BRIDGE="$PREFIX-br"
CTL="$PREFIX-ctl"
LOGIN_NODE="$PREFIX-login"

log() { echo "local-cluster: $*" >&2; }
die() { log "$*"; exit 1; }
owned() { grep -qxF "$1" "$RUN/created" 2>/dev/null; }
node_count() { cat "$RUN/nodes" 2>/dev/null || echo 2; }
worker() { echo "$PREFIX-n$1"; }

check_names() {
  [[ "$SUBNET" =~ ^(10|192\.168|172\.(1[6-9]|2[0-9]|3[01]))\.[0-9]+(\.[0-9]+)?$ ]] ||
    die "LOCAL_CLUSTER_SUBNET=$SUBNET is not the first three octets of a private /24 (10.x.y, 172.16-31.y, 192.168.y)"
  [ "${#BRIDGE}" -le 15 ] && [ "${#LOGIN_NODE}" -le 15 ] || die "LOCAL_CLUSTER_PREFIX=$PREFIX is too long (interface names are at most 15 characters)"
}

need_tools() {
  [ "$(id -u)" -eq 0 ] || die "network namespaces need root; run as root (CI runs make test as root)"
  local missing=()
  for tool in ip unshare sshd ssh-keygen slurmctld slurmd munged prometheus prometheus-node-exporter; do
    command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || missing+=("$tool")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "missing ${missing[*]}: installing the system packages (scripts/system-deps.sh)"
    "$ROOT/scripts/system-deps.sh"
  fi
}

# A namespace or the bridge: made and recorded, or already ours; someone else's with the same name is an error.
claim() {
  local kind="$1" name="$2" exists=0
  if [ "$kind" = netns ]; then [ -e "/run/netns/$name" ] && exists=1; else ip link show "$name" >/dev/null 2>&1 && exists=1; fi
  if [ $exists = 1 ]; then
    owned "$kind:$name" || die "$kind $name exists but was not made by this cluster ($BASE); stop its owner or set LOCAL_CLUSTER_PREFIX"
    return 1
  fi
  return 0
}

make_bridge() {
  if claim link "$BRIDGE"; then
    if ip -4 route show | grep -q "^$SUBNET\.0/24"; then die "subnet $SUBNET.0/24 is already routed on this machine; set LOCAL_CLUSTER_SUBNET"; fi
    ip link add "$BRIDGE" type bridge 2>"$LOG/ip.err" || die "cannot create bridge $BRIDGE: $(cat "$LOG/ip.err") (needs CAP_NET_ADMIN)"
    echo "link:$BRIDGE" >>"$RUN/created"
    ip addr add "$SUBNET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
}

make_node_netns() {
  local name="$1" addr="$2"
  claim netns "$name" || return 0
  ip netns add "$name" 2>"$LOG/ip.err" || die "cannot create network namespace $name: $(cat "$LOG/ip.err") (needs root and CAP_SYS_ADMIN)"
  echo "netns:$name" >>"$RUN/created"
  ip link add "$name" type veth peer name "$name-p" 2>"$LOG/ip.err" || die "cannot create veth pair for $name: $(cat "$LOG/ip.err")"
  ip link set "$name-p" netns "$name"
  ip link set "$name" master "$BRIDGE"
  ip link set "$name" up
  ip netns exec "$name" ip link set lo up
  ip netns exec "$name" ip link set "$name-p" name eth0
  ip netns exec "$name" ip addr add "$addr/24" dev eth0
  ip netns exec "$name" ip link set eth0 up
}

# Run a command inside a node: its network namespace, its own hostname and the cluster's /etc/hosts, /etc/slurm
# and jail mount (bind mounts private to the node; /sys stays this machine's, so slurmd finds its cgroups).
# This machine's local package mirrors (LOCAL_MIRRORS) are covered by an empty read-only tmpfs in every node:
# like the network, no package source but what the pipeline ships reaches the nodes.
# Daemons fork away and keep these namespaces.
in_node() {
  local netns="$1" host="$2"
  shift 2
  nsenter --net="/run/netns/$netns" unshare --mount --uts --propagation private sh -c '
    hostname "$1" && mount --bind "$2/hosts" /etc/hosts && mount --bind "$2" /etc/slurm &&
      mount --bind "$3" "$4" || exit 1
    for mirror in $5; do [ ! -d "$mirror" ] || mount -t tmpfs -o size=64k,ro none "$mirror" || exit 1; done
    shift 5
    exec "$@"' sh "$host" "$ETC" "$JAIL" "$JAIL_MOUNT" "$LOCAL_MIRRORS" "$@"
}

write_config() {
  local nodes="$1" cpus mem_mb i addrs
  cpus=$(( $(nproc) / nodes )); [ "$cpus" -ge 1 ] || cpus=1
  mem_mb=$(( $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) * 90 / 100 / nodes ))
  {
    echo "127.0.0.1 localhost"
    echo "$SUBNET.2 $CTL"
    echo "$SUBNET.3 $LOGIN_NODE"
    for i in $(seq "$nodes"); do echo "$SUBNET.$((10 + i)) $(worker "$i")"; done
  } >"$ETC/hosts.tmp"
  mv "$ETC/hosts.tmp" "$ETC/hosts"
  cat >"$CONF.tmp" <<EOF
# Written by scripts/local-cluster.sh; edits are overwritten on start.
ClusterName=$PREFIX
SlurmctldHost=$CTL($SUBNET.2)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmdTimeout=10
$(common_slurm_settings)
$(job_metrics_settings "$MON/textfile/\$(hostname)" prolog)
EOF
  addrs=""
  for i in $(seq "$nodes"); do
    echo "NodeName=$(worker "$i") NodeAddr=$SUBNET.$((10 + i)) CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN" >>"$CONF.tmp"
    addrs="$addrs${addrs:+,}$(worker "$i")"
  done
  echo "PartitionName=cluster Nodes=$addrs Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" >>"$CONF.tmp"
  serving_partitions "$nodes" >>"$CONF.tmp"
  power_save_settings >>"$CONF.tmp"
  mv "$CONF.tmp" "$CONF"
}

suspend_time() { cat "$RUN/suspend_time" 2>/dev/null || echo 0; }
serving_nodes() { cat "$RUN/serving_nodes" 2>/dev/null || echo 0; }

# Workers reserved for serving: the last K nodes in `serve`, the others in `main` (names the cluster stack's
# serving.partition and serving.trainingPartition default to).
serving_partitions() {
  local nodes="$1" reserved i training="" serving=""
  reserved="$(serving_nodes)"
  [ "$reserved" -gt 0 ] || return 0
  [ "$reserved" -lt "$nodes" ] || die "--serving-nodes $reserved reserves every one of the $nodes node(s): none would be left for training"
  for i in $(seq "$nodes"); do
    if [ "$i" -le $((nodes - reserved)) ]; then training="$training${training:+,}$(worker "$i")"
    else serving="$serving${serving:+,}$(worker "$i")"; fi
  done
  echo "PartitionName=main Nodes=$training Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO"
  echo "PartitionName=serve Nodes=$serving Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO"
}

# Slurm power saving as Soperator 4.1.7 sets it for ephemeral nodes (internal/render/common/configmap.go:
# SuspendProgram/ResumeProgram, idle_on_node_suspend), with timeouts small enough for tests. The programs call
# this script back (power-down / power-up) with the cluster's environment.
power_save_settings() {
  local seconds program
  seconds="$(suspend_time)"
  [ "$seconds" -gt 0 ] || return 0
  for program in power-down power-up; do
    cat >"$ETC/$program.sh.tmp" <<EOF2
#!/bin/sh
# Written by scripts/local-cluster.sh: Slurm's $program program for the cluster in $BASE.
export LOCAL_CLUSTER_DIR="$BASE" LOCAL_CLUSTER_PREFIX="$PREFIX" LOCAL_CLUSTER_SUBNET="$SUBNET" \\
  LOCAL_CLUSTER_CTLD_PORT="$CTLD_PORT" LOCAL_CLUSTER_SLURMD_PORT="$SLURMD_PORT" PATH="$PATH"
exec "$ROOT/scripts/local-cluster.sh" request-$program "\$1" >>"$LOG/power.log" 2>&1
EOF2
    chmod 755 "$ETC/$program.sh.tmp"
    mv "$ETC/$program.sh.tmp" "$ETC/$program.sh"
  done
  cat <<EOF2
SuspendTime=$seconds
SuspendTimeout=5
ResumeTimeout=60
SuspendProgram=$ETC/power-down.sh
ResumeProgram=$ETC/power-up.sh
SlurmctldParameters=idle_on_node_suspend,power_save_interval=1,power_save_min_interval=0
EOF2
}

# The node names of a Slurm hostlist (fe-n[1-2]) as this cluster names its workers.
hostnames() { scontrol show hostnames "$1"; }

# Slurm's programs only record the wanted power state (as Soperator's power-manager updates the NodeSetPowerState);
# the power agent, started with the cluster, acts on it (as the operator stops and starts the worker pod). A slurmd
# started from inside slurmctld's program runner lost its log and failed every batch launch here.
request_power() {
  local want="$1" node
  mkdir -p "$RUN/power"
  for node in $(hostnames "$2"); do echo "$want" >"$RUN/power/$node.tmp" && mv "$RUN/power/$node.tmp" "$RUN/power/$node"; done
  log "requested power $want for $2"
}

power_agent() {
  local request node want
  while :; do
    for request in "$RUN"/power/*; do
      [ -f "$request" ] || continue
      node="${request##*/}"
      [[ "$node" != *.tmp ]] || continue
      want="$(cat "$request")"
      rm -f "$request"
      if [ "$want" = up ]; then (power_up "$node") || true; else (power_down "$node") || true; fi
    done
    sleep 0.5
  done
}

start_power_agent() {
  if [ "$(suspend_time)" -gt 0 ]; then
    alive "$RUN/power-agent.pid" && return
    mkdir -p "$RUN/power"
    setsid "$ROOT/scripts/local-cluster.sh" power-agent >>"$LOG/power.log" 2>&1 </dev/null &
    echo $! >"$RUN/power-agent.pid"
  else
    stop_daemon "$RUN/power-agent.pid" "power agent"
  fi
}

power_down() {
  local node
  for node in $(hostnames "$1"); do
    owned "netns:$node" || die "$node is not a node of the cluster in $BASE"
    stop_daemon "$RUN/slurmd-$node.pid" "slurmd of $node"
    log "powered down $node"
  done
}

power_up() {
  local node
  # slurmd -b reports a boot at its start, in whole seconds: one strictly after Slurm's resume request
  sleep 1
  for node in $(hostnames "$1"); do
    owned "netns:$node" || die "$node is not a node of the cluster in $BASE"
    # a slurmd left running (a resume that timed out) would never report the boot Slurm waits for
    stop_daemon "$RUN/slurmd-$node.pid" "slurmd of $node"
    mkdir -p "$SPOOL/$node"
    # -b: report a reboot, as a new worker pod on a new VM does (Slurm waits for a boot newer than the resume request)
    in_node "$node" "$node" slurmd -b || die "slurmd did not start in $node; see $LOG/slurmd-$node.log"
    wait_pidfile "$RUN/slurmd-$node.pid" "slurmd of $node" "$LOG/slurmd-$node.log"
    log "powered up $node"
  done
}

keygen() { [ -s "$1" ] || ssh-keygen -q -t ed25519 -N "" -C "$2" -f "$1"; }

start_login() {
  mkdir -p "$LOGIN" /run/sshd
  keygen "$LOGIN/ssh_host_ed25519_key" "$LOGIN_NODE"
  keygen "$LOGIN/id_ed25519" "ftstack@$PREFIX"
  cp "$LOGIN/id_ed25519.pub" "$LOGIN/authorized_keys"
  cat >"$LOGIN/sshd_config" <<EOF
# Written by scripts/local-cluster.sh: the login node's sshd.
ListenAddress $SUBNET.3
Port 22
HostKey $LOGIN/ssh_host_ed25519_key
PidFile $RUN/sshd.pid
AuthorizedKeysFile $LOGIN/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
MaxStartups 30:50:60
Subsystem sftp internal-sftp
EOF
  alive "$RUN/sshd.pid" && return
  in_node "$LOGIN_NODE" "$LOGIN_NODE" /usr/sbin/sshd -f "$LOGIN/sshd_config" -E "$LOG/sshd.log" ||
    die "sshd did not start in $LOGIN_NODE; see $LOG/sshd.log"
}

wait_pidfile() {
  for _ in $(seq 100); do alive "$1" && return; sleep 0.1; done
  die "$2 did not start; see $3"
}

start_daemons() {
  local nodes="$1" i
  if ! alive "$RUN/slurmctld.pid"; then
    in_node "$CTL" "$CTL" slurmctld || die "slurmctld did not start in $CTL; see $LOG/slurmctld.log"
    wait_pidfile "$RUN/slurmctld.pid" slurmctld "$LOG/slurmctld.log"
  fi
  for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q "is UP" && break; sleep 0.2; done
  for i in $(seq "$nodes"); do
    alive "$RUN/slurmd-$(worker "$i").pid" && continue
    powered_down "$(worker "$i")" && continue
    mkdir -p "$SPOOL/$(worker "$i")"
    in_node "$(worker "$i")" "$(worker "$i")" slurmd || die "slurmd did not start in $(worker "$i"); see $LOG/slurmd-$(worker "$i").log"
    wait_pidfile "$RUN/slurmd-$(worker "$i").pid" "slurmd of $(worker "$i")" "$LOG/slurmd-$(worker "$i").log"
  done
}

# Whether power saving is on and Slurm has the node powered down or powering down (its slurmd stays stopped).
powered_down() {
  [ "$(suspend_time)" -gt 0 ] || return 1
  case "$(sinfo -h -n "$1" -o '%t' 2>/dev/null)" in *~ | *%) return 0 ;; *) return 1 ;; esac
}

# A node exporter in every worker, and Prometheus in the controller's namespace scraping them.
start_monitoring() {
  local nodes="$1" i node targets=()
  mkdir -p "$MON/etc"
  for i in $(seq "$nodes"); do
    node="$(worker "$i")"
    start_node_exporter "$RUN/node-exporter-$node.pid" "$LOG/node-exporter-$node.log" "$SUBNET.$((10 + i)):9100" \
      "$MON/textfile/$node" in_node "$node" "$node"
    targets+=("$SUBNET.$((10 + i)):9100=$node")
  done
  write_prometheus_config "$MON/etc/prometheus.yml" "${targets[@]}"
  start_prometheus "$RUN/prometheus.pid" "$LOG/prometheus.log" "$SUBNET.2:9090" "$MON/etc/prometheus.yml" "$MON/data" \
    in_node "$CTL" "$CTL"
  echo "http://$SUBNET.2:9090" >"$MON/prometheus.url"
}

wait_idle() {
  local nodes="$1" state="" i
  for i in $(seq "$nodes"); do
    local node
    node="$(worker "$i")"
    for _ in $(seq 300); do
      state="$(sinfo -h -n "$node" -o '%T' 2>/dev/null || true)"
      node_up "$state" && break
      case "$state" in down* | drain*) scontrol update nodename="$node" state=resume 2>/dev/null || true ;; esac
      sleep 0.2
    done
    node_up "$state" || die "node $node did not become idle (last state: ${state:-none}); see $LOG"
  done
  log "$nodes node(s) up, login $SUBNET.3:22, prometheus http://$SUBNET.2:9090 (SLURM_CONF=$CONF)"
}

start() {
  local nodes="$1" i
  check_names
  need_tools
  mkdir -p "$ETC" "$RUN" "$LOG" "$STATE" "$SPOOL" "$MUNGE" "$LOGIN" "$JAIL/home/shared" "$JAIL/opt" "$JAIL_MOUNT" /etc/slurm
  if [ -f "$RUN/nodes" ] && [ "$(cat "$RUN/nodes")" != "$nodes" ]; then
    die "the cluster in $BASE has $(cat "$RUN/nodes") node(s); stop it before starting it with $nodes"
  fi
  echo "$nodes" >"$RUN/nodes"
  [ -z "$suspend" ] || echo "$suspend" >"$RUN/suspend_time"
  [ -z "$serving" ] || echo "$serving" >"$RUN/serving_nodes"
  # the jail holds no Python packages of ours: the pipeline's environment stage builds them (docs/environment.md)
  if [ -L "$JAIL/opt/venv" ]; then rm -f "$JAIL/opt/venv"; fi
  write_config "$nodes"
  make_bridge
  make_node_netns "$CTL" "$SUBNET.2"
  make_node_netns "$LOGIN_NODE" "$SUBNET.3"
  for i in $(seq "$nodes"); do make_node_netns "$(worker "$i")" "$SUBNET.$((10 + i))"; done
  start_munge
  start_login
  start_daemons "$nodes"
  [ -z "$suspend$serving" ] || scontrol reconfigure || die "scontrol reconfigure failed; see $LOG/slurmctld.log"
  start_power_agent
  start_monitoring "$nodes"
  wait_idle "$nodes"
}

# Everything still running in a namespace of ours (job steps, training processes) ends with it.
kill_netns_processes() {
  local name="$1" pids
  pids="$(ip netns pids "$name" 2>/dev/null || true)"
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
}

lose_node() {
  local node="$1"
  owned "netns:$node" || die "$node is not a node of the cluster in $BASE"
  kill_netns_processes "$node"
  rm -f "$RUN/slurmd-$node.pid"
  log "lost $node: its slurmd and every process in it were killed"
}

stop() {
  local entry i
  stop_daemon "$RUN/power-agent.pid" "power agent"
  stop_daemon "$RUN/prometheus.pid" prometheus
  for i in $(seq "$(node_count)"); do
    stop_daemon "$RUN/node-exporter-$(worker "$i").pid" "node exporter of $(worker "$i")"
    stop_daemon "$RUN/slurmd-$(worker "$i").pid" "slurmd of $(worker "$i")"
  done
  stop_daemon "$RUN/slurmctld.pid" slurmctld
  stop_daemon "$RUN/sshd.pid" sshd
  stop_daemon "$MUNGE/munged.pid" munged
  [ -f "$RUN/created" ] || return 0
  for entry in $(tac "$RUN/created"); do
    case "$entry" in
      # the host end of the node's veth pair too: deleting the namespace does not always take it along (seen
      # here after a run that left SSH sessions open), and a leftover end blocks the next start
      netns:*) kill_netns_processes "${entry#netns:}"; ip netns del "${entry#netns:}" 2>/dev/null || true
               ip link del "${entry#netns:}" 2>/dev/null || true ;;
      link:*) ip link del "${entry#link:}" 2>/dev/null || true ;;
    esac
  done
  rm -f "$RUN/created" "$RUN/nodes" "$RUN/suspend_time"
  rmdir "$JAIL_MOUNT" "/run/$PREFIX" 2>/dev/null || true
  log "namespaces and bridge removed"
}

status() {
  local rc=0 d i
  for d in "$MUNGE/munged.pid:munged" "$RUN/slurmctld.pid:slurmctld" "$RUN/sshd.pid:sshd (login $SUBNET.3:22)" \
    "$RUN/prometheus.pid:prometheus (http://$SUBNET.2:9090)"; do
    if alive "${d%%:*}"; then echo "${d#*:}: running ($(cat "${d%%:*}"))"; else echo "${d#*:}: stopped"; rc=1; fi
  done
  for i in $(seq "$(node_count)"); do
    if alive "$RUN/slurmd-$(worker "$i").pid"; then echo "slurmd $(worker "$i"): running"
    elif powered_down "$(worker "$i")"; then echo "slurmd $(worker "$i"): powered down (power saving)"
    else echo "slurmd $(worker "$i"): stopped"; rc=1; fi
    if alive "$RUN/node-exporter-$(worker "$i").pid"; then echo "node exporter $(worker "$i"): running"; else echo "node exporter $(worker "$i"): stopped"; rc=1; fi
  done
  [ $rc -eq 0 ] && sinfo -N -o '%N %T %c %m'
  return $rc
}

USAGE="usage: $0 start|stop|status [--nodes N] [--suspend-time S] [--serving-nodes K] | lose-node NAME | power-down|power-up HOSTLIST"
command="${1:-}"
shift || true
nodes=2
suspend=""
serving=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes="${2:-}"; shift 2 ;;
    --nodes=*) nodes="${1#--nodes=}"; shift ;;
    --suspend-time) suspend="${2:-}"; shift 2 ;;
    --suspend-time=*) suspend="${1#--suspend-time=}"; shift ;;
    --serving-nodes) serving="${2:-}"; shift 2 ;;
    --serving-nodes=*) serving="${1#--serving-nodes=}"; shift ;;
    *) case "$command" in lose-node | power-down | power-up | request-power-*) [ -z "${target:-}" ] && { target="$1"; shift; continue; } ;; esac
       echo "$USAGE" >&2; exit 2 ;;
  esac
done
[[ "$nodes" =~ ^[1-9][0-9]?$ ]] || die "--nodes must be a number from 1 to 99, got '$nodes'"
[ -z "$serving" ] || [[ "$serving" =~ ^[0-9]{1,2}$ ]] || die "--serving-nodes must be a whole number of nodes (0 reserves none), got '$serving'"
[ -z "$serving" ] || [ "$serving" -lt "$nodes" ] || die "--serving-nodes $serving reserves every one of the $nodes node(s): none would be left for training"
[ -z "$suspend" ] || [[ "$suspend" =~ ^[0-9]{1,6}$ ]] || die "--suspend-time must be whole seconds (0 turns power saving off), got '$suspend'"
case "$command" in
  start) start "$nodes" ;;
  stop) stop ;;
  status) status ;;
  lose-node) lose_node "${target:?$USAGE}" ;;
  power-down) power_down "${target:?$USAGE}" ;;
  power-up) power_up "${target:?$USAGE}" ;;
  request-power-down) request_power down "${target:?$USAGE}" ;;
  request-power-up) request_power up "${target:?$USAGE}" ;;
  power-agent) power_agent ;;
  *) echo "$USAGE" >&2; exit 2 ;;
esac
