#!/usr/bin/env bash
# Single-node Slurm on this machine for the `local` stack and the tests.
#   scripts/local-slurm.sh start    install slurm-wlm + munge if missing, write config, start daemons, wait idle
#   scripts/local-slurm.sh stop     stop only the daemons this script started (by their pid files)
#   scripts/local-slurm.sh status   daemons and sinfo
# Config, state, logs and pid files live under .local/slurm/. Clients find the config through
#   export SLURM_CONF=<repo>/.local/slurm/etc/slurm.conf
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BASE="${LOCAL_SLURM_DIR:-$ROOT/.local/slurm}"
# shellcheck source=scripts/slurm-common.sh
. "$ROOT/scripts/slurm-common.sh"
CTLD_PORT="${LOCAL_SLURM_CTLD_PORT:-6817}"
SLURMD_PORT="${LOCAL_SLURM_SLURMD_PORT:-6818}"
NODE="$(hostname -s)"

log() { echo "local-slurm: $*" >&2; }

install_packages() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return
  log "installing slurm-wlm and munge"
  "$ROOT/scripts/system-deps.sh"
}

write_config() {
  mkdir -p "$ETC" "$RUN" "$LOG" "$STATE" "$SPOOL" "$MUNGE"
  local cpus mem_mb
  cpus="$(nproc)"
  mem_mb="$(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo)"
  mem_mb=$((mem_mb * 95 / 100))
  cat >"$CONF.tmp" <<EOF
# Written by scripts/local-slurm.sh; edits are overwritten on start.
ClusterName=local
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmdPidFile=$RUN/slurmd.pid
SlurmdLogFile=$LOG/slurmd.log
SchedulerParameters=defer_batch
SlurmdTimeout=60
$(common_slurm_settings)
$(job_metrics_settings "${LOCAL_MONITORING_DIR:-$ROOT/.local/monitoring}/textfile")
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  mv "$CONF.tmp" "$CONF"
}

start_daemons() {
  alive "$RUN/slurmctld.pid" || slurmctld
  for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q "is UP" && break; sleep 0.2; done
  alive "$RUN/slurmd.pid" || slurmd -N "$NODE"
}

wait_idle() {
  local state=""
  for _ in $(seq 150); do
    state="$(sinfo -h -n "$NODE" -o '%T' 2>/dev/null || true)"
    if node_up "$state"; then log "node $NODE is $state (SLURM_CONF=$CONF)"; return; fi
    case "$state" in down* | drain*) scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;; esac
    sleep 0.2
  done
  log "node $NODE did not become idle (last state: ${state:-none}); see $LOG"
  exit 1
}

start() {
  install_packages
  if alive "$RUN/slurmctld.pid" && alive "$RUN/slurmd.pid" && alive "$MUNGE/munged.pid"; then
    wait_idle
    return
  fi
  write_config
  start_munge
  start_daemons
  wait_idle
}

stop_pid() {
  local pidfile="$1" name="$2"
  if alive "$pidfile"; then
    local pid
    pid="$(cat "$pidfile")"
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    log "stopped $name ($pid)"
  fi
  rm -f "$pidfile"
}

stop() {
  stop_pid "$RUN/slurmd.pid" slurmd
  stop_pid "$RUN/slurmctld.pid" slurmctld
  stop_pid "$MUNGE/munged.pid" munged
}

status() {
  local rc=0
  for d in "$MUNGE/munged.pid:munged" "$RUN/slurmctld.pid:slurmctld" "$RUN/slurmd.pid:slurmd"; do
    if alive "${d%%:*}"; then echo "${d##*:}: running ($(cat "${d%%:*}"))"; else echo "${d##*:}: stopped"; rc=1; fi
  done
  [ $rc -eq 0 ] && sinfo
  return $rc
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
