#!/usr/bin/env bash
# Trains vit_jax on a SLURM GPU cluster: one process per GPU, started by srun, on one or more
# nodes. vit_jax.main sees the job step's tasks (SLURM_STEP_NUM_TASKS, SLURM_PROCID) and joins
# them with jax.distributed.initialize(); JAX gives each task the GPU of its SLURM_LOCALID.
#
#   launch/slurm_gpu.sh [--dry-run] [OPTIONS] [install|submit] [-- MAIN_FLAGS...]
#
# Commands:
#   install  create --venv (on storage every node reads) with the versions of
#            launch/requirements.txt, jax[cuda13] and this checkout (editable)
#   submit   (the default) write WORKDIR/job.sbatch and submit it with sbatch
# Options [default]:
#   --nodes [1]  --gpus_per_node [8]  --cpus_per_task [8]  --time [24:00:00]
#   --partition  --account  --job_name [vit_jax]  --cuda [cuda13] (or cuda12)
#   --venv [~/.venvs/vit_jax]
#   --config [configs/vit.py:variant=S/16,dataset=imagenet2012]
#   --workdir (required for submit; shared storage)  --data_dir [TFDS's default]
# MAIN_FLAGS go to vit_jax.main, e.g. -- --config.batch_size=1024.
# The job gets SIGTERM 5 minutes before its time limit: training saves a checkpoint and exits
# with status 75 ("preempted, rerun to resume"), on which the job requeues itself and resumes;
# any other status ends it (0: finished).
# --dry-run prints the batch script and every command instead of running them.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JAX_VERSION="$(sed -n 's/^jax==//p' "$REPO/launch/requirements.txt")"

dry_run=0
nodes=1
gpus_per_node=8
cpus_per_task=8
time_limit=24:00:00
partition=
account=
job_name=vit_jax
cuda=cuda13
venv="$HOME/.venvs/vit_jax"
config='configs/vit.py:variant=S/16,dataset=imagenet2012'
workdir=
data_dir=
command=submit
command_given=0
main_flags=()

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "slurm_gpu.sh: $*" >&2; exit 2; }

while (($#)); do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --nodes=*) nodes="${1#*=}" ;;
    --gpus_per_node=*) gpus_per_node="${1#*=}" ;;
    --cpus_per_task=*) cpus_per_task="${1#*=}" ;;
    --time=*) time_limit="${1#*=}" ;;
    --partition=*) partition="${1#*=}" ;;
    --account=*) account="${1#*=}" ;;
    --job_name=*) job_name="${1#*=}" ;;
    --cuda=*) cuda="${1#*=}" ;;
    --venv=*) venv="${1#*=}" ;;
    --config=*) config="${1#*=}" ;;
    --workdir=*) workdir="${1#*=}" ;;
    --data_dir=*) data_dir="${1#*=}" ;;
    -h|--help) usage ;;
    --) shift; main_flags=("$@"); break ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) ((command_given == 0)) || die "one command only, got '$command' and '$1'"
       command="$1"; command_given=1 ;;
  esac
  shift
done
[[ -n "$JAX_VERSION" ]] || die "no jax==VERSION line in $REPO/launch/requirements.txt"
for count in "$nodes" "$gpus_per_node" "$cpus_per_task"; do
  [[ "$count" =~ ^[1-9][0-9]*$ ]] || die "--nodes, --gpus_per_node and --cpus_per_task must be \
positive integers, got '$count'"
done

# A command as one line that a shell reads back as the same words.
quote() {
  local word out=()
  for word in "$@"; do
    if [[ "$word" =~ ^[A-Za-z0-9_./:=@,+%^-]+$ ]]; then
      out+=("$word")
    else
      out+=("'${word//\'/\'\\\'\'}'")
    fi
  done
  echo "${out[*]}"
}

run() {
  if ((dry_run)); then
    echo "$(quote "$@")"
  else
    echo "+ $(quote "$@")" >&2
    "$@"
  fi
}

batch_script() {
  local train=(python -m vit_jax.main "--config=$config" "--workdir=$workdir")
  [[ -z "$data_dir" ]] || train+=("--config.data_dir=$data_dir")
  train+=(${main_flags[@]+"${main_flags[@]}"})
  cat <<EOF
#!/bin/bash
#SBATCH --job-name=$job_name
#SBATCH --nodes=$nodes
#SBATCH --ntasks-per-node=$gpus_per_node
#SBATCH --gpus-per-node=$gpus_per_node
#SBATCH --cpus-per-task=$cpus_per_task
#SBATCH --time=$time_limit
#SBATCH --signal=TERM@300
#SBATCH --requeue
#SBATCH --output=$workdir/slurm-%j.out
EOF
  [[ -z "$partition" ]] || echo "#SBATCH --partition=$partition"
  [[ -z "$account" ]] || echo "#SBATCH --account=$account"
  cat <<EOF
set -euo pipefail
cd $(quote "$REPO")
source $(quote "$venv/bin/activate")
export TF_CPP_MIN_LOG_LEVEL=2
# One task per GPU; every task sees the node's GPUs and JAX keeps the one of its SLURM_LOCALID.
status=0
srun --kill-on-bad-exit=1 $(quote "${train[@]}") || status=\$?
# 75: interrupted after saving a checkpoint (vit_jax.process.exits.EXIT_PREEMPTED): run again.
if [[ \$status -eq 75 ]]; then scontrol requeue "\$SLURM_JOB_ID"; fi
exit \$status
EOF
}

do_install() {
  run python3.12 -m venv "$venv"
  run "$venv/bin/pip" install --upgrade pip
  run "$venv/bin/pip" install -r "$REPO/launch/requirements.txt" "jax[$cuda]==$JAX_VERSION" \
    -e "$REPO"
}

do_submit() {
  [[ -n "$workdir" ]] || die "submit needs --workdir=DIR on storage that every node shares"
  [[ "$workdir" == /* || "$workdir" == *://* ]] || workdir="$PWD/$workdir"
  local script="$workdir/job.sbatch"
  if ((dry_run)); then
    echo "$(quote mkdir -p "$workdir")"
    echo "cat > $(quote "$script") <<'EOF'"
    batch_script
    echo "EOF"
  else
    mkdir -p "$workdir"
    batch_script > "$script"
  fi
  run sbatch "$script"
}

case "$command" in
  install) do_install ;;
  submit) do_submit ;;
  *) die "unknown command '$command'; valid: install submit" ;;
esac
