#!/usr/bin/env bash
# Installs the Debian packages the local stack and the tests need, when missing.
#   slurm-wlm, munge   local single-node Slurm (scripts/local-slurm.sh)
#   openssh-server     real sshd on loopback for the SSH transport tests, and the rehearsal cluster's login node
#   iproute2, procps   network namespaces and bridge of the rehearsal cluster (scripts/local-cluster.sh), ps in its tests
#   chromium           headless browser for the chat UI and dashboard tests
#   prometheus, prometheus-node-exporter
#                      metrics store and node exporter of the local and cluster stacks (scripts/local-monitoring.sh);
#                      run as plain processes by that script, never as the system services
#   jq                 the JSON filter docs/evaluation-and-serving.md's commands pipe into (run as written by the tests)
set -euo pipefail
packages=(slurm-wlm munge openssh-server chromium iproute2 procps prometheus prometheus-node-exporter jq)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "system-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
