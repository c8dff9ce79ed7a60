#!/usr/bin/env bash
# `make demo`: the whole pipeline on the local stack through the local Slurm (the Makefile started it),
# prepare -> readiness -> train -> eval, then the evaluator's comparison, the cost per chat priced on the
# `demo` stack, the run's artifacts under .local/artifacts and a dashboard under .local/dashboard/local.
# A second run with nothing changed submits nothing and reprints the same results.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
export SLURM_CONF="${SLURM_CONF:-$ROOT/.local/slurm/etc/slurm.conf}"
FTSTACK="$ROOT/.venv/bin/ftstack"

start=$SECONDS
"$FTSTACK" run --stack local --wait --cost-stack demo
"$FTSTACK" runs --stack local
"$FTSTACK" report --stack local --outputs "$ROOT/.local/pipeline/local-outputs.json" --out "$ROOT/.local/dashboard/local"
echo "demo: finished in $((SECONDS - start)) s"
