#!/usr/bin/env bash
# A real Prometheus and node exporter for the `local` stack (Debian's prometheus, prometheus-node-exporter),
# on loopback only, run as plain processes (never the system services).
#   scripts/local-monitoring.sh start    install the packages if missing, write the config, start what is stopped
#   scripts/local-monitoring.sh stop     stop only the daemons this script started (by their pid files)
#   scripts/local-monitoring.sh status   daemons and the Prometheus URL
# Layout under LOCAL_MONITORING_DIR (default <repo>/.local/monitoring): etc/prometheus.yml, data/ (the TSDB),
# textfile/ (the node exporter's textfile collector: jobs write job-metrics .prom files there, see
# workloads/common/job_metrics.py), run/*.pid, log/*.log, and prometheus.url (what ftstack reads).
# Environment: LOCAL_MONITORING_DIR, LOCAL_MONITORING_PROMETHEUS_PORT (19090), LOCAL_MONITORING_NODE_EXPORTER_PORT
# (19100), LOCAL_MONITORING_SCRAPE_INTERVAL (5s).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BASE="${LOCAL_MONITORING_DIR:-$ROOT/.local/monitoring}"
PROMETHEUS_LISTEN="127.0.0.1:${LOCAL_MONITORING_PROMETHEUS_PORT:-19090}"
EXPORTER_LISTEN="127.0.0.1:${LOCAL_MONITORING_NODE_EXPORTER_PORT:-19100}"
RUN="$BASE/run"
LOG="$BASE/log"

log() { echo "local-monitoring: $*" >&2; }
die() { log "$*"; exit 1; }
# shellcheck source=scripts/monitoring-common.sh
. "$ROOT/scripts/monitoring-common.sh"

install_packages() {
  command -v prometheus >/dev/null && command -v prometheus-node-exporter >/dev/null && return
  log "installing prometheus and prometheus-node-exporter"
  "$ROOT/scripts/system-deps.sh"
}

start() {
  install_packages
  mkdir -p "$BASE/etc" "$RUN" "$LOG"
  start_node_exporter "$RUN/node-exporter.pid" "$LOG/node-exporter.log" "$EXPORTER_LISTEN" "$BASE/textfile"
  write_prometheus_config "$BASE/etc/prometheus.yml" "$EXPORTER_LISTEN=$(hostname -s)"
  start_prometheus "$RUN/prometheus.pid" "$LOG/prometheus.log" "$PROMETHEUS_LISTEN" "$BASE/etc/prometheus.yml" "$BASE/data"
  echo "http://$PROMETHEUS_LISTEN" >"$BASE/prometheus.url.tmp"
  mv "$BASE/prometheus.url.tmp" "$BASE/prometheus.url"
  log "prometheus http://$PROMETHEUS_LISTEN scrapes the node exporter $EXPORTER_LISTEN (textfile dir $BASE/textfile)"
}

stop() {
  stop_daemon "$RUN/prometheus.pid" prometheus
  stop_daemon "$RUN/node-exporter.pid" prometheus-node-exporter
  rm -f "$BASE/prometheus.url"
}

status() {
  local rc=0 d
  for d in "$RUN/prometheus.pid:prometheus http://$PROMETHEUS_LISTEN" "$RUN/node-exporter.pid:prometheus-node-exporter $EXPORTER_LISTEN"; do
    if alive "${d%%:*}"; then echo "${d#*:}: running ($(cat "${d%%:*}"))"; else echo "${d#*:}: stopped"; rc=1; fi
  done
  return $rc
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
