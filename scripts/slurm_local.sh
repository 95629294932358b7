#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for the tests that submit real jobs
# (tests/system/test_slurm_job.py) and for trying `memoire train --launcher slurm` by hand.
#
#   scripts/slurm_local.sh install   # Debian's slurm-wlm and munge (root; skipped when installed)
#   eval "$(scripts/slurm_local.sh start)"   # munged, slurmctld, slurmd; prints `export SLURM_CONF=..`
#   scripts/slurm_local.sh stop      # stops the daemons this script started (by their pid files)
#
# Every daemon is this cluster's own, munged included (its socket in $SLURM_LOCAL_DIR/munge,
# named by slurm.conf's AuthInfo): several such clusters run side by side.
#
# Runs as root without systemd. State, logs and slurm.conf go to $SLURM_LOCAL_DIR (default
# ${TMPDIR:-/tmp}/memoire-slurm). The controller's and the node daemon's ports are free ports
# chosen at start, so this cluster can run beside another one on the same machine.
set -euo pipefail
D=${SLURM_LOCAL_DIR:-${TMPDIR:-/tmp}/memoire-slurm}

installed() { command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; }

free_port() {  # a port in the kernel's ephemeral range that nothing listens on now
  local lo hi port
  read -r lo hi < /proc/sys/net/ipv4/ip_local_port_range
  for _ in $(seq 100); do
    port=$(( lo + RANDOM % (hi - lo) ))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
  done
  echo "no free port found" >&2
  return 1
}

running() {  # process $1 exists and is not a zombie (a daemon's parent here may not reap it)
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) && [ -n "$state" ] && [ "${state:0:1}" != Z ]
}
alive() { [ -s "$1" ] && running "$(cat "$1")"; }
stop_pid_file() {  # kill the daemon of pid file $1 and wait (bounded) until it is gone
  alive "$1" || return 0
  local pid
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do running "$pid" || return 0; sleep 0.2; done
  echo "$pid ($1) did not stop in 10 s" >&2
}

case "${1:-}" in
install)
  installed && exit 0
  [ "$(id -u)" = 0 ] || { echo "installing SLURM needs root (apt-get)" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
  installed
  ;;
start)
  installed || { echo "SLURM is not installed: $0 install" >&2; exit 1; }
  mkdir -p "$D"/{state,spool,log,munge}
  # munge authenticates SLURM's messages: a munged of this cluster's own (its key, socket and
  # pid file under $D), so that stopping it never cuts off another cluster on this machine
  # (a test's, another checkout's) that uses the machine's munged. Root runs it (--force).
  chmod 0755 "$D/munge"
  if [ ! -s "$D/munge/munge.key" ]; then
    (umask 077; head -c 1024 /dev/urandom > "$D/munge/munge.key")
  fi
  chmod 0400 "$D/munge/munge.key"
  if ! alive "$D/munge/munged.pid" || [ ! -S "$D/munge/munge.socket" ]; then
    munged --force --socket="$D/munge/munge.socket" --key-file="$D/munge/munge.key" \
      --pid-file="$D/munge/munged.pid" --log-file="$D/munge/munged.log" \
      --seed-file="$D/munge/munged.seed"
  fi
  export SLURM_CONF="$D/slurm.conf"
  if ! alive "$D/slurmctld.pid"; then
    host=$(hostname -s)
    cpus=$(( $(nproc) > 8 ? $(nproc) : 8 ))
    mem=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 1024 ))
    cat > "$SLURM_CONF" <<CONF
ClusterName=memoire
SlurmctldHost=$host
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$D/munge/munge.socket
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
# More CPUs than the machine has, so a learner and its actors fit on a 2-core machine.
SlurmdParameters=config_overrides
KillWait=30
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    slurmctld -c -f "$SLURM_CONF"
  fi
  alive "$D/slurmd.pid" || slurmd -f "$SLURM_CONF"
  for _ in $(seq 60); do
    sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)' && break
    sleep 0.5
  done
  sinfo -h -o %T | grep -qE '^(idle|mixed|allocated)' \
    || { echo "the node did not come up; see $D/log/" >&2; exit 1; }
  echo "export SLURM_CONF=$SLURM_CONF"
  ;;
stop)
  stop_pid_file "$D/slurmd.pid"
  stop_pid_file "$D/slurmctld.pid"
  stop_pid_file "$D/munge/munged.pid"
  ;;
*)
  echo "usage: $0 install|start|stop" >&2
  exit 2
  ;;
esac
