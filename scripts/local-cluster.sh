#!/usr/bin/env bash
# A multi-node Slurm cluster on this machine, one Linux network namespace per node, for the `cluster` stack.
#   scripts/local-cluster.sh start [--nodes N]   make what is missing, start what is stopped, wait until idle; the
#                                                nodes are the `cluster` stack's (--stack-file FILE, default
#                                                stacks/Pulumi.cluster.yaml; --nodes N replaces its cluster.nodes)
#   scripts/local-cluster.sh stop                end what this script started (its pid files and namespaces)
#   scripts/local-cluster.sh status              daemons, namespaces, sinfo
#   scripts/local-cluster.sh lose-node NAME      kill a worker node: its slurmd and every process in it
#   start --serving-nodes K                      reserve K nodes for serving (the stack's serving.nodes; kept
#                                                across starts, 0 undoes): NodeSet worker-serve in partition
#                                                `serve`, NodeSet worker in `main`, `hidden` over all
#   start --values FILE                          Soperator values (documents/soperator_values.py) instead of the
#                                                stack's: what a Soperator install of them gives its workers
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
#   <subnet>.11+ <prefix>-n1..N  one per worker pod of the values' NodeSets (<nodeset>-<i>, sorted as the operator
#                                sorts them): slurmd as Soperator's worker image starts it (no -Z: a static node that
#                                finds its NodeName line by its hostname, or exits); prometheus-node-exporter on
#                                :9100 reading <dir>/monitoring/textfile/<node>, the folder a TaskProlog gives the
#                                node's jobs for their metrics (an Epilog cleans up)
# slurm.conf's node and partition lines are those Soperator 4.1.7 renders from the SlurmCluster and NodeSet custom
# resources Helm makes of the values (python -m infra.soperator.rehearsal writes <dir>/etc/values.yaml,
# custom-resources.yaml, nodes.conf, pods and slurmd.args); a worker the values give no NodeName line fails the start
# as it fails on the cloud. The hosts file names each node by its pod name
# and by the address Soperator gives it (<pod>.<cluster>-nodeset-svc.<namespace>.svc.cluster.local).
# Each node also has its own UTS namespace (hostname = node name) and mount namespace in which the cluster's
# hosts file is /etc/hosts, its config folder is /etc/slurm and the jail (<dir>/jail on this machine's shared
# filesystem) is mounted at /run/<prefix>/jail: the stack's jail root. One munged (socket under <dir>/munge)
# serves every node. Needs root (network namespaces), iproute2, openssh-server, slurm-wlm, munge, prometheus and
# prometheus-node-exporter. The Prometheus URL is written to <dir>/monitoring/prometheus.url.
# Environment: LOCAL_CLUSTER_DIR (default <repo>/.local/cluster), LOCAL_CLUSTER_PREFIX (default ftc; names of
# namespaces and bridge), LOCAL_CLUSTER_SUBNET (default 10.213.0, a /24), LOCAL_CLUSTER_CTLD_PORT (6990),
# LOCAL_CLUSTER_HIDDEN_MIRRORS (this machine's package folders hidden from the nodes; default /opt/pypi
# /opt/pypi-more /opt/wheels). Needs the project's venv (make venv). Clients on this machine: export
# SLURM_CONF=<dir>/etc/slurm.conf
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BASE="${LOCAL_CLUSTER_DIR:-$ROOT/.local/cluster}"
PREFIX="${LOCAL_CLUSTER_PREFIX:-ftc}"
SUBNET="${LOCAL_CLUSTER_SUBNET:-10.213.0}"
CTLD_PORT="${LOCAL_CLUSTER_CTLD_PORT:-6990}"
PYTHON="$ROOT/.venv/bin/python"
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
# The worker pods of the values the cluster was started from: the Slurm node (and hostname) of node i is the i-th
# pod, its namespace $PREFIX-n<i>, its address <subnet>.<10 + i>.
node_count() { if [ -f "$ETC/pods" ]; then wc -l <"$ETC/pods"; else echo 0; fi; }
worker() { awk -v i="$1" 'NR == i {print $1}' "$ETC/pods"; }
netns() { echo "$PREFIX-n$1"; }
node_index() {
  local i
  i="$(awk -v n="$1" '$1 == n {print NR}' "$ETC/pods" 2>/dev/null)"
  [ -n "$i" ] && owned "netns:$(netns "$i")" || die "$1 is not a node of the cluster in $BASE"
  echo "$i"
}

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

# A start's setting: the flag's value, else the one kept from an earlier start (in $RUN/NAME).
kept() { if [ -n "$2" ]; then echo "$2"; else cat "$RUN/$1" 2>/dev/null || true; fi; }

# The nodes from the values into folder $1: the stack's (its cluster.nodes and serving.nodes replaced by --nodes and
# --serving-nodes), or a values file's (--values). Refused, before anything is made, when the cluster runs others.
render_nodes() {
  local out="$1" args=(--stack-file "$stack_file" --out "$1")
  [ -x "$PYTHON" ] || die "no project venv at $ROOT/.venv (make venv): the nodes are rendered from the values with it"
  [ -z "$nodes" ] || args+=(--nodes "$nodes")
  [ -z "$serving" ] || args+=(--serving-nodes "$serving")
  [ -z "$values" ] || args+=(--values "$values")
  (cd "$ROOT" && "$PYTHON" -m infra.soperator.rehearsal "${args[@]}") || exit 1
  [ -s "$out/pods" ] || die "the values give no worker pod (no NodeSet); see $out/values.yaml"
  if [ -f "$ETC/pods" ] && ! cmp -s "$ETC/pods" "$out/pods" && owned "netns:$(netns 1)"; then
    die "the cluster in $BASE runs nodes $(awk '{print $1}' "$ETC/pods" | paste -sd,); stop it before starting" \
      "it with $(awk '{print $1}' "$out/pods" | paste -sd,)"
  fi
}

write_config() {
  local i
  {
    echo "127.0.0.1 localhost"
    echo "$SUBNET.2 $CTL"
    echo "$SUBNET.3 $LOGIN_NODE"
    for i in $(seq "$(node_count)"); do echo "$SUBNET.$((10 + i)) $(awk -v i="$i" 'NR == i {print $1, $2}' "$ETC/pods")"; done
  } >"$ETC/hosts.tmp"
  mv "$ETC/hosts.tmp" "$ETC/hosts"
  cat >"$CONF.tmp" <<EOF
# Written by scripts/local-cluster.sh; edits are overwritten on start. Nodes and partitions: Soperator 4.1.7's
# rendering of $ETC/custom-resources.yaml, Helm's of $ETC/values.yaml (infra/soperator/render.py).
ClusterName=$PREFIX
SlurmctldHost=$CTL($SUBNET.2)
SlurmctldPort=$CTLD_PORT
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmdTimeout=10
# as Soperator 4.1.7 (internal/render/common/configmap.go:362): slurmctld starts with no node line too
MaxNodeCount=1024
# powered-down State=CLOUD nodes shown, as Slurm 23.02 and later (Soperator's 25.11) show them; 22.05 hides them
PrivateData=cloud
$(common_slurm_settings)
$(job_metrics_settings "$MON/textfile/\$(hostname)" prolog)
EOF
  cat "$ETC/nodes.conf" >>"$CONF.tmp"
  power_save_settings >>"$CONF.tmp"
  mv "$CONF.tmp" "$CONF"
}

suspend_time() { cat "$RUN/suspend_time" 2>/dev/null || echo 0; }

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
  LOCAL_CLUSTER_CTLD_PORT="$CTLD_PORT" PATH="$PATH"
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
    stop_power_agent
  fi
}

# The power agent with the power-up or power-down it may be carrying out (its session, setsid), and the requests no
# one has answered: a power-down still running after `start --suspend-time 0` had found the node's slurmd alive
# left that node down with power saving off (seen under load: worker-1, then every 2-node job pending).
stop_power_agent() {
  stop_daemon "$RUN/power-agent.pid" "power agent" group
  rm -f "$RUN"/power/*
}

power_down() {
  local node
  for node in $(hostnames "$1"); do
    node_index "$node" >/dev/null
    stop_daemon "$RUN/slurmd-$node.pid" "slurmd of $node"
    log "powered down $node"
  done
}

power_up() {
  local node i
  # slurmd -b reports a boot at its start, in whole seconds: one strictly after Slurm's resume request
  sleep 1
  for node in $(hostnames "$1"); do
    i="$(node_index "$node")"
    # a slurmd left running (a resume that timed out) would never report the boot Slurm waits for
    stop_daemon "$RUN/slurmd-$node.pid" "slurmd of $node"
    # its -b reports a reboot, as a new worker pod on a new VM does (Slurm waits for a boot newer than the resume)
    start_slurmd "$i"
    log "powered up $node"
  done
}

# slurmd of node i as Soperator's worker image starts it ($ETC/slurmd.args). One that finds no NodeName line for its
# hostname exits, and the start fails saying why.
start_slurmd() {
  local node
  node="$(worker "$1")"
  mkdir -p "$SPOOL/$node"
  # shellcheck disable=SC2046 # one argument per word of the file
  if ! in_node "$(netns "$1")" "$node" slurmd $(cat "$ETC/slurmd.args") 2>"$LOG/slurmd-$node.start"; then
    grep -q "^NodeName=$node " "$CONF" ||
      die "slurmd of $node exited ($(tail -n 1 "$LOG/slurmd-$node.start")): slurm.conf has no NodeName line for it." \
        "Soperator 4.1.7 writes node lines only with partitionConfiguration.configType structured" \
        "(internal/render/common/configmap.go:369-386), and a worker's slurmd (no -Z) finds its node there or exits:" \
        "this worker would never join Slurm on the cloud either. The values: $ETC/values.yaml; what Helm made of" \
        "them: $ETC/custom-resources.yaml"
    die "slurmd did not start in $node: $(tail -n 1 "$LOG/slurmd-$node.start"); see $LOG/slurmd-$node.log"
  fi
  wait_pidfile "$RUN/slurmd-$node.pid" "slurmd of $node" "$LOG/slurmd-$node.log"
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
  local i
  if ! alive "$RUN/slurmctld.pid"; then
    in_node "$CTL" "$CTL" slurmctld || die "slurmctld did not start in $CTL; see $LOG/slurmctld.log"
    wait_pidfile "$RUN/slurmctld.pid" slurmctld "$LOG/slurmctld.log"
  fi
  for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q "is UP" && break; sleep 0.2; done
  for i in $(seq "$(node_count)"); do
    alive "$RUN/slurmd-$(worker "$i").pid" && continue
    adopt_slurmd "$i" && continue
    powered_down "$(worker "$i")" && continue
    start_slurmd "$i"
  done
}

# A live slurmd in node i's namespace whose pid file is gone (a power-down that raced a start removed it; seen after
# lose-node in a loaded suite, where the second slurmd then failed on port 6818 in use) is the node's slurmd: its pid
# file is written again instead of starting another. Zombies (killed, not reaped here) do not count.
adopt_slurmd() {
  local node pid
  node="$(worker "$1")"
  pid="$(ip netns pids "$(netns "$1")" 2>/dev/null | xargs -r ps -o pid=,stat=,comm= -p 2>/dev/null |
    awk '$2 !~ /^Z/ && $3 == "slurmd" {print $1; exit}')"
  [ -n "$pid" ] || return 1
  echo "$pid" >"$RUN/slurmd-$node.pid"
  log "slurmd of $node runs already ($pid) without its pid file: adopted"
}

# Whether power saving is on and Slurm has the node powered down or powering down (its slurmd stays stopped).
powered_down() {
  [ "$(suspend_time)" -gt 0 ] || return 1
  case "$(sinfo -h -n "$1" -o '%t' 2>/dev/null)" in *~ | *%) return 0 ;; *) return 1 ;; esac
}

# A node exporter in every worker, and Prometheus in the controller's namespace scraping them.
start_monitoring() {
  local i node targets=()
  mkdir -p "$MON/etc"
  for i in $(seq "$(node_count)"); do
    node="$(worker "$i")"
    start_node_exporter "$RUN/node-exporter-$node.pid" "$LOG/node-exporter-$node.log" "$SUBNET.$((10 + i)):9100" \
      "$MON/textfile/$node" in_node "$(netns "$i")" "$node"
    targets+=("$SUBNET.$((10 + i)):9100=$node")
  done
  write_prometheus_config "$MON/etc/prometheus.yml" "${targets[@]}"
  start_prometheus "$RUN/prometheus.pid" "$LOG/prometheus.log" "$SUBNET.2:9090" "$MON/etc/prometheus.yml" "$MON/data" \
    in_node "$CTL" "$CTL"
  echo "http://$SUBNET.2:9090" >"$MON/prometheus.url"
}

wait_idle() {
  local state="" i
  for i in $(seq "$(node_count)"); do
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
  log "$(node_count) node(s) up, login $SUBNET.3:22, prometheus http://$SUBNET.2:9090 (SLURM_CONF=$CONF)"
}

start() {
  local i rendered
  check_names
  need_tools
  stack_file="$(kept stack_file "$stack_file")"
  stack_file="$(realpath "${stack_file:-$ROOT/stacks/Pulumi.cluster.yaml}")"
  nodes="$(kept nodes "$nodes")"
  serving="$(kept serving_nodes "$serving")"
  if [ -n "$values" ]; then values="$(realpath "$values")"; elif [ -f "$RUN/values.yaml" ]; then values="$RUN/values.yaml"; fi
  rendered="$(mktemp -d)"
  trap "rm -rf '$rendered'" EXIT
  render_nodes "$rendered"
  mkdir -p "$ETC" "$RUN" "$LOG" "$STATE" "$SPOOL" "$MUNGE" "$LOGIN" "$JAIL/home/shared" "$JAIL/opt" "$JAIL_MOUNT" /etc/slurm
  echo "$stack_file" >"$RUN/stack_file"
  [ -z "$nodes" ] || echo "$nodes" >"$RUN/nodes"
  [ -z "$serving" ] || echo "$serving" >"$RUN/serving_nodes"
  [ -z "$values" ] || [ "$values" = "$RUN/values.yaml" ] || cp "$values" "$RUN/values.yaml"
  [ -z "$suspend" ] || echo "$suspend" >"$RUN/suspend_time"
  mv "$rendered"/* "$ETC/"
  rmdir "$rendered"
  # the jail holds no Python packages of ours: the pipeline's environment stage builds them (docs/environment.md)
  if [ -L "$JAIL/opt/venv" ]; then rm -f "$JAIL/opt/venv"; fi
  write_config
  make_bridge
  make_node_netns "$CTL" "$SUBNET.2"
  make_node_netns "$LOGIN_NODE" "$SUBNET.3"
  for i in $(seq "$(node_count)"); do make_node_netns "$(netns "$i")" "$SUBNET.$((10 + i))"; done
  start_munge
  start_login
  # power saving off: no power-down may follow the daemons' start
  [ "$(suspend_time)" -gt 0 ] || stop_power_agent
  start_daemons
  # a slurmctld already running reads the configuration written above
  scontrol reconfigure || die "scontrol reconfigure failed; see $LOG/slurmctld.log"
  start_power_agent
  start_monitoring
  wait_idle
}

# Everything still running in a namespace of ours (job steps, training processes) ends with it, killed until none is
# left: one listing misses what forks between it and the kill (a stepd starting a task, a batch script its next
# command), and such a survivor of a lost node would run on beside the requeued job. Bounded in rounds, not time;
# zombies are not listed (their /proc ns links are gone).
kill_netns_processes() {
  local name="$1" pids round
  for round in $(seq 50); do
    pids="$(ip netns pids "$name" 2>/dev/null || true)"
    [ -n "$pids" ] || return 0
    kill -9 $pids 2>/dev/null || true
  done
  log "processes still in $name after $round rounds of kill -9: $(echo $pids)"
}

lose_node() {
  local node="$1" i
  i="$(node_index "$node")"
  kill_netns_processes "$(netns "$i")"
  # the killed daemons' pid files go too: a killed process stays a zombie, alive to kill -0, where pid 1 does not
  # reap orphans (this machine's init), and start would skip restarting it
  rm -f "$RUN/slurmd-$node.pid" "$RUN/node-exporter-$node.pid"
  log "lost $node: its slurmd, its node exporter and every process in it were killed"
}

stop() {
  local entry i
  stop_power_agent
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
  rm -f "$RUN/created" "$RUN/nodes" "$RUN/suspend_time" "$RUN/serving_nodes" "$RUN/stack_file" "$RUN/values.yaml" "$ETC/pods"
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

USAGE="usage: $0 start|stop|status [--stack-file FILE] [--values FILE] [--nodes N] [--suspend-time S] [--serving-nodes K] | lose-node NAME | power-down|power-up HOSTLIST"
command="${1:-}"
shift || true
nodes=""
suspend=""
serving=""
stack_file=""
values=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes="${2:-}"; shift 2 ;;
    --nodes=*) nodes="${1#--nodes=}"; shift ;;
    --suspend-time) suspend="${2:-}"; shift 2 ;;
    --suspend-time=*) suspend="${1#--suspend-time=}"; shift ;;
    --serving-nodes) serving="${2:-}"; shift 2 ;;
    --serving-nodes=*) serving="${1#--serving-nodes=}"; shift ;;
    --stack-file) stack_file="${2:-}"; shift 2 ;;
    --values) values="${2:-}"; shift 2 ;;
    *) case "$command" in lose-node | power-down | power-up | request-power-*) [ -z "${target:-}" ] && { target="$1"; shift; continue; } ;; esac
       echo "$USAGE" >&2; exit 2 ;;
  esac
done
[ -z "$nodes" ] || [[ "$nodes" =~ ^[1-9][0-9]?$ ]] || die "--nodes must be a number from 1 to 99, got '$nodes'"
[ -z "$serving" ] || [[ "$serving" =~ ^[0-9]{1,2}$ ]] || die "--serving-nodes must be a whole number of nodes (0 reserves none), got '$serving'"
[ -z "$stack_file" ] || [ -f "$stack_file" ] || die "--stack-file $stack_file: no such file"
[ -z "$values" ] || [ -f "$values" ] || die "--values $values: no such file"
[ -z "$suspend" ] || [[ "$suspend" =~ ^[0-9]{1,6}$ ]] || die "--suspend-time must be whole seconds (0 turns power saving off), got '$suspend'"
case "$command" in
  start) start ;;
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
