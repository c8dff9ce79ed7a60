# Shared by scripts/local-slurm.sh and scripts/local-cluster.sh (sourced, not run): the folder layout under BASE,
# munged and the slurm.conf settings both clusters use. The caller sets BASE first and defines log().

ETC="$BASE/etc"
RUN="$BASE/run"
LOG="$BASE/log"
STATE="$BASE/state"
SPOOL="$BASE/spool"
MUNGE="$BASE/munge"
CONF="$ETC/slurm.conf"
export SLURM_CONF="$CONF"

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Whether a node state (sinfo -o %T) is up: its slurmd has registered. A state with a trailing `*` (not responding)
# is not, also `idle*`, which a down node resumed by `scontrol` shows until its restarted slurmd registers (a job
# started on it then has its step killed when the registration comes in).
node_up() {
  case "$1" in *'*') return 1 ;; idle* | mixed* | allocated* | completing*) return 0 ;; *) return 1 ;; esac
}

start_munge() {
  alive "$MUNGE/munged.pid" && return
  if [ ! -s "$MUNGE/munge.key" ]; then
    (umask 077 && dd if=/dev/urandom bs=1 count=1024 of="$MUNGE/munge.key.tmp" status=none)
    mv "$MUNGE/munge.key.tmp" "$MUNGE/munge.key"
  fi
  chmod 700 "$MUNGE"
  chmod 400 "$MUNGE/munge.key"
  munged --force --key-file="$MUNGE/munge.key" --socket="$MUNGE/munge.socket" \
    --pid-file="$MUNGE/munged.pid" --log-file="$MUNGE/munged.log" --seed-file="$MUNGE/munged.seed"
  for _ in $(seq 50); do [ -S "$MUNGE/munge.socket" ] && return; sleep 0.1; done
  log "munged did not create its socket; see $MUNGE/munged.log"
  exit 1
}

# slurm.conf lines common to both: root daemons, munge auth, one state/spool/log layout, no accounting,
# requeue allowed, finished jobs kept a day for `scontrol show job`.
common_slurm_settings() {
  cat <<EOF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE/munge.socket
CredType=cred/munge
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmctldLogFile=$LOG/slurmctld.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobRequeue=1
MinJobAge=86400
KillWait=30
InactiveLimit=0
SlurmctldTimeout=60
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
EOF
}

# Job metrics (workloads/common/job_metrics.py): an Epilog that removes a job's metrics files from the node
# exporter's textfile folder when the job ends, even a killed one (as Soperator's unmap_job_dcgm.sh epilog drops
# a job's DCGM mapping), and with `prolog` a TaskProlog that tells every task the folder. TEXTFILE is a shell
# expression evaluated on the node, e.g. '/x/textfile/$(hostname)' for a folder per node. Prints the slurm.conf lines.
job_metrics_settings() {
  local textfile="$1" prolog="${2:-}"
  cat >"$ETC/job-epilog.sh.tmp" <<EOF2
#!/bin/sh
# Written by scripts/slurm-common.sh: the job's metrics end with the job.
rm -f "$textfile/ftstack_job_\${SLURM_JOB_ID}_"*.prom
exit 0
EOF2
  chmod 755 "$ETC/job-epilog.sh.tmp"
  mv "$ETC/job-epilog.sh.tmp" "$ETC/job-epilog.sh"
  echo "Epilog=$ETC/job-epilog.sh"
  [ "$prolog" = prolog ] || return 0
  cat >"$ETC/task-prolog.sh.tmp" <<EOF2
#!/bin/sh
# Written by scripts/slurm-common.sh: where this node's exporter reads job metrics.
echo "export FTSTACK_METRICS_TEXTFILE_DIR=$textfile"
EOF2
  chmod 755 "$ETC/task-prolog.sh.tmp"
  mv "$ETC/task-prolog.sh.tmp" "$ETC/task-prolog.sh"
  echo "TaskProlog=$ETC/task-prolog.sh"
}
