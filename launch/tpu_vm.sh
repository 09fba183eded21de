#!/usr/bin/env bash
# Trains vit_jax on a Cloud TPU VM, one host or a pod slice: every worker runs the same command,
# reads its share of a TFDS dataset on GCS and writes to one work directory on GCS.
#
#   launch/tpu_vm.sh [--dry-run] [OPTIONS] COMMAND [-- MAIN_FLAGS...]
#
# Commands, in the order of a run:
#   create   create the TPU VM
#   install  copy this checkout (git archive HEAD) to every worker and install Python 3.12 with
#            the versions of launch/requirements.txt and jax[tpu]
#   prepare  prepare the config's dataset in --data_dir, on worker 0 only
#   train    start `python -m vit_jax.main` on every worker in the background (~/vit_jax.log)
#   logs     follow worker 0's log (--log_worker=all: every worker's)
#   stop     SIGTERM the training on every worker: it saves a checkpoint and exits; `train`
#            again resumes from it
#   delete   delete the TPU VM
#   up       create, install, prepare, train, logs
# Options [default]:
#   --name [vit-jax]  --zone [us-central2-b]  --project [gcloud's default]
#   --accelerator [v4-32]  --runtime [tpu-ubuntu2204-base]  --spot
#   --config [configs/vit.py:variant=S/4,dataset=cifar10]
#   --bucket gs://BUCKET: sets --workdir [BUCKET/vit_jax/NAME] and --data_dir
#            [BUCKET/tensorflow_datasets]; both must be gs:// URIs, which every worker shares
#   --log_worker [0]
# MAIN_FLAGS go to vit_jax.main, e.g. -- --config.batch_size=1024 --config.base_lr=2e-3.
# --dry-run prints every command instead of running it.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
UV_VERSION=0.13.9
JAX_VERSION="$(sed -n 's/^jax==//p' "$REPO/launch/requirements.txt")"

dry_run=0
name=vit-jax
zone=us-central2-b
project=
accelerator=v4-32
runtime=tpu-ubuntu2204-base
spot=0
config='configs/vit.py:variant=S/4,dataset=cifar10'
bucket=
workdir=
data_dir=
log_worker=0
command=
main_flags=()

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "tpu_vm.sh: $*" >&2; exit 2; }

while (($#)); do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --name=*) name="${1#*=}" ;;
    --zone=*) zone="${1#*=}" ;;
    --project=*) project="${1#*=}" ;;
    --accelerator=*) accelerator="${1#*=}" ;;
    --runtime=*) runtime="${1#*=}" ;;
    --spot) spot=1 ;;
    --config=*) config="${1#*=}" ;;
    --bucket=*) bucket="${1#*=}"; bucket="${bucket%/}" ;;
    --workdir=*) workdir="${1#*=}" ;;
    --data_dir=*) data_dir="${1#*=}" ;;
    --log_worker=*) log_worker="${1#*=}" ;;
    -h|--help) usage ;;
    --) shift; main_flags=("$@"); break ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [[ -z "$command" ]] || die "one command only, got '$command' and '$1'"; command="$1" ;;
  esac
  shift
done
[[ -n "$command" ]] || usage 2
[[ -n "$JAX_VERSION" ]] || die "no jax==VERSION line in $REPO/launch/requirements.txt"
if [[ -n "$bucket" ]]; then
  workdir="${workdir:-$bucket/vit_jax/$name}"
  data_dir="${data_dir:-$bucket/tensorflow_datasets}"
fi

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

gcloud_tpu() {  # gcloud compute tpus tpu-vm SUBCOMMAND ... with the zone and project.
  local args=(gcloud compute tpus tpu-vm "$@" "--zone=$zone")
  [[ -z "$project" ]] || args+=("--project=$project")
  run "${args[@]}"
}

on_workers() {  # WORKERS REMOTE_COMMAND
  gcloud_tpu ssh "$name" "--worker=$1" "--command=$2"
}

need_gcs() {
  [[ "$workdir" == gs://* && "$data_dir" == gs://* ]] || die "$command needs --bucket=gs://BUCKET \
(or --workdir=gs://... and --data_dir=gs://...): every worker must read and write the same \
storage; got workdir='$workdir' data_dir='$data_dir'"
}

config_overrides() {  # The --config.FIELD=VALUE flags among MAIN_FLAGS.
  local flag
  for flag in ${main_flags[@]+"${main_flags[@]}"}; do
    [[ "$flag" != --config.* ]] || printf ' %s' "$(quote "$flag")"
  done
}

do_create() {
  local args=(create "$name" "--accelerator-type=$accelerator" "--version=$runtime")
  ((spot == 0)) || args+=(--spot)
  gcloud_tpu "${args[@]}"
}

do_install() {
  local archive="${TMPDIR:-/tmp}/vit_jax-$name.tar.gz"
  run git -C "$REPO" archive --format=tar.gz "--output=$archive" HEAD
  gcloud_tpu scp "$archive" "$name:vit_jax.tar.gz" --worker=all
  local remote
  remote="set -e; rm -rf ~/vit_jax ~/venv; mkdir -p ~/vit_jax"
  remote+="; tar -xzf ~/vit_jax.tar.gz -C ~/vit_jax"
  remote+="; python3 -m pip install --user --quiet uv==$UV_VERSION"
  remote+="; ~/.local/bin/uv venv --python 3.12 ~/venv"
  remote+="; ~/.local/bin/uv pip install --python ~/venv/bin/python"
  remote+=" -r ~/vit_jax/launch/requirements.txt 'jax[tpu]==$JAX_VERSION' -e ~/vit_jax"
  remote+="; ~/venv/bin/python -c 'import jax, vit_jax; print(\"jax\", jax.__version__)'"
  on_workers all "$remote"
}

do_prepare() {
  need_gcs
  on_workers 0 "cd ~/vit_jax && ~/venv/bin/python launch/prepare_data.py \
$(quote "--config=$config" "--data_dir=$data_dir")$(config_overrides)"
}

do_train() {
  need_gcs
  local flags
  flags="$(quote --distributed=on "--config=$config" "--workdir=$workdir" \
    "--config.data_dir=$data_dir" ${main_flags[@]+"${main_flags[@]}"})"
  on_workers all "cd ~/vit_jax && (setsid nohup ~/venv/bin/python -m vit_jax.main $flags \
> ~/vit_jax.log 2>&1 < /dev/null & echo \$! > ~/vit_jax.pid)"
}

do_logs() {
  on_workers "$log_worker" "tail -n +1 -F ~/vit_jax.log"
}

do_stop() {
  on_workers all "kill -TERM \$(cat ~/vit_jax.pid) && echo 'SIGTERM sent: saving a checkpoint'"
}

do_delete() {
  gcloud_tpu delete "$name" --quiet
}

case "$command" in
  create) do_create ;;
  install) do_install ;;
  prepare) do_prepare ;;
  train) do_train ;;
  logs) do_logs ;;
  stop) do_stop ;;
  delete) do_delete ;;
  up) need_gcs; do_create; do_install; do_prepare; do_train; do_logs ;;
  *) die "unknown command '$command'; valid: create install prepare train logs stop delete up" ;;
esac
