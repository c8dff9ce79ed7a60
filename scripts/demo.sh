#!/usr/bin/env bash
# `make demo`: submit the pipeline for the local stack to the local Slurm and follow it.
# For now the pipeline is the prepare job (base model + data); `make demo` has already started Slurm.
#   FT_CONFIG   run config (default workloads/configs/local.json)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
export SLURM_CONF="${SLURM_CONF:-$ROOT/.local/slurm/etc/slurm.conf}"
CONFIG="${FT_CONFIG:-workloads/configs/local.json}"
PY="$ROOT/.venv/bin/python"
LOGS="$ROOT/.local/logs"
mkdir -p "$LOGS"

"$PY" -c "import sys; from workloads.config import load_run_config; load_run_config(sys.argv[1])" "$CONFIG"

job="$(sbatch --parsable --output="$LOGS/prepare-%j.out" --cpus-per-task="$(nproc)" \
  --export="ALL,FT_PYTHON=$PY,FT_CODE_DIR=$ROOT" workloads/jobs/prepare.sbatch "$CONFIG")"
log="$LOGS/prepare-$job.out"
echo "demo: submitted prepare job $job (log: $log)"

start=$SECONDS
last=""
while :; do
  state="$(scontrol show job "$job" -o | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)"
  line="$(tail -n 1 "$log" 2>/dev/null | tr '\r' '\n' | tail -n 1 | cut -c1-120 || true)"
  if [ "$state $line" != "$last" ]; then
    printf 'demo: [%4ds] job %s %-10s %s\n' $((SECONDS - start)) "$job" "$state" "$line"
    last="$state $line"
  fi
  case "$state" in
    COMPLETED) break ;;
    FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE)
      echo "demo: prepare job $job ended $state; last lines of $log:" >&2
      tail -n 40 "$log" >&2
      exit 1 ;;
  esac
  sleep 2
done

echo "demo: prepare job $job completed in $((SECONDS - start)) s"
"$PY" - "$CONFIG" <<'PY'
import sys
from workloads.config import load_run_config

config = load_run_config(sys.argv[1])
for label, path in [
    ("base model", config.base_model_dir),
    ("conversations", config.conversations_file),
    ("train split", config.train_jsonl),
    ("test split", config.test_jsonl),
    ("train tokens", config.train_tokenized_dir),
    ("test tokens", config.test_tokenized_dir),
]:
    print(f"  {label:<14} {path}")
PY
