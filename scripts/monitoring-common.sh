# Shared by scripts/local-monitoring.sh and scripts/local-cluster.sh (sourced, not run): Debian's prometheus and
# prometheus-node-exporter run as plain processes (never the system services), each with a pid file, a log and,
# for Prometheus, a config and a data folder of its own. The caller defines log() and die().
#   start_node_exporter PIDFILE LOGFILE LISTEN TEXTFILE_DIR [LAUNCHER...]
#   start_prometheus    PIDFILE LOGFILE LISTEN CONFIG DATA_DIR [LAUNCHER...]
# LAUNCHER is a command prefix the daemon starts under (local-cluster.sh: in_node NETNS HOST, to start it inside
# a node); it must end by running its arguments.

MONITORING_SCRAPE_INTERVAL="${LOCAL_MONITORING_SCRAPE_INTERVAL:-5s}"

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# launch PIDFILE LOGFILE [LAUNCHER...] -- COMMAND...: start COMMAND detached (own session, under LAUNCHER); it
# writes its own pid file before it execs, so the pid is the daemon's whatever LAUNCHER forks.
launch() {
  local pidfile="$1" logfile="$2" launcher=()
  shift 2
  while [ "$1" != -- ]; do launcher+=("$1"); shift; done
  shift
  rm -f "$pidfile"
  "${launcher[@]}" setsid -f sh -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" >>"$logfile" 2>&1 </dev/null ||
    die "could not start $1; see $logfile"
}

# Until the daemon of PIDFILE accepts connections on ADDR:PORT; its end is an error naming its log.
wait_listening() {
  local pidfile="$1" listen="$2" name="$3" logfile="$4" i
  for i in $(seq 150); do
    if (exec 3<>"/dev/tcp/${listen%%:*}/${listen##*:}") 2>/dev/null; then return 0; fi
    [ "$i" -gt 5 ] && ! alive "$pidfile" && die "$name exited before listening on $listen; see $logfile"
    sleep 0.2
  done
  die "$name did not listen on $listen; see $logfile"
}

start_node_exporter() {
  local pidfile="$1" logfile="$2" listen="$3" textfile="$4"
  shift 4
  mkdir -p "$textfile"
  chmod 1777 "$textfile"
  alive "$pidfile" && return 0
  launch "$pidfile" "$logfile" "$@" -- prometheus-node-exporter --web.listen-address="$listen" --collector.textfile.directory="$textfile"
  wait_listening "$pidfile" "$listen" prometheus-node-exporter "$logfile"
}

# The scrape config: one `node` job over TARGETS (addr:port[=node name] ...), each target labelled with its node.
write_prometheus_config() {
  local config="$1" target addr
  shift
  {
    echo "# Written by scripts/monitoring-common.sh; edits are overwritten on start."
    echo "global:"
    echo "  scrape_interval: $MONITORING_SCRAPE_INTERVAL"
    echo "  evaluation_interval: $MONITORING_SCRAPE_INTERVAL"
    echo "scrape_configs:"
    echo "  - job_name: node"
    echo "    static_configs:"
    for target in "$@"; do
      addr="${target%%=*}"
      echo "      - targets: ['$addr']"
      [ "$target" != "$addr" ] && echo "        labels: {slurm_node: '${target#*=}'}"
    done
  } >"$config.tmp"
  mv "$config.tmp" "$config"
}

start_prometheus() {
  local pidfile="$1" logfile="$2" listen="$3" config="$4" data="$5"
  shift 5
  mkdir -p "$data"
  alive "$pidfile" && return 0
  launch "$pidfile" "$logfile" "$@" -- prometheus --config.file="$config" --storage.tsdb.path="$data" --web.listen-address="$listen" \
    --storage.tsdb.retention.time=15d
  wait_listening "$pidfile" "$listen" prometheus "$logfile"
}

# stop_daemon PIDFILE NAME [group]: SIGTERM, SIGKILL after 10 s; with `group` to the daemon's whole process group
# (a setsid leader with what it is carrying out), which may have ended meanwhile.
stop_daemon() {
  local pidfile="$1" name="$2" pid target
  if alive "$pidfile"; then
    pid="$(cat "$pidfile")"
    target="$pid"
    if [ "${3:-}" = group ]; then target="-$pid"; kill -- "$target" 2>/dev/null || true; else kill "$pid"; fi
    for _ in $(seq 100); do kill -0 -- "$target" 2>/dev/null || break; sleep 0.1; done
    kill -0 -- "$target" 2>/dev/null && kill -9 -- "$target"
    log "stopped $name ($pid)"
  fi
  rm -f "$pidfile"
}
