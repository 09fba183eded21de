"""The launch scripts: valid bash; --dry-run prints exactly the commands a real run executes.

A real run is made against stand-ins for gcloud and sbatch that record their arguments, so the
dry-run listing is checked against what the script really runs, word for word.
"""

import json
import os
import shlex
import subprocess
import sys

import pytest

from vit_jax.workdir import reader
from vit_jax.workdir import run_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU = os.path.join(REPO, 'launch', 'tpu_vm.sh')
SLURM = os.path.join(REPO, 'launch', 'slurm_gpu.sh')
RECORDER = """#!{python}
import json, os, sys
with open(os.environ['LAUNCH_TEST_CALLS'], 'a') as f:
  f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + '\\n')
"""


def requirement_pins() -> dict[str, str]:
  with open(os.path.join(REPO, 'launch', 'requirements.txt')) as f:
    lines = [line.strip() for line in f if line.strip() and not line.startswith('#')]
  return dict(line.split('==') for line in lines)


@pytest.fixture
def recorder(tmp_path):
  """A PATH whose gcloud and sbatch record their argument lists; returns (env, read_calls)."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  for name in ('gcloud', 'sbatch'):
    path = bin_dir / name
    path.write_text(RECORDER.format(python=sys.executable))
    path.chmod(0o755)
  calls = tmp_path / 'calls.jsonl'
  env = dict(
      os.environ,
      PATH=f'{bin_dir}:{os.environ["PATH"]}',
      LAUNCH_TEST_CALLS=str(calls),
      TMPDIR=str(tmp_path),
      HOME=str(tmp_path / 'home'),
  )

  def read_calls():
    if not calls.exists():
      return []
    return [json.loads(line) for line in calls.read_text().splitlines()]

  return env, read_calls


def launch(script, args, env, check=True):
  out = subprocess.run(['bash', script, *args], capture_output=True, text=True, env=env, timeout=60)
  if check:
    assert out.returncode == 0, out.stderr
  return out


@pytest.mark.parametrize('script', [TPU, SLURM])
def test_scripts_are_valid_bash(script):
  out = subprocess.run(['bash', '-n', script], capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
  help_text = subprocess.run(['bash', script, '--help'], capture_output=True, text=True).stdout
  assert '--dry-run' in help_text


TPU_ARGS = [
    '--bucket=gs://my-bucket',
    '--accelerator=v4-32',
    '--zone=us-central2-b',
    '--project=my-project',
]
TRAIN_FLAGS = ['--', '--config.batch_size=1024', '--config.base_lr=2e-3']


def test_tpu_dry_run_prints_the_commands_of_a_run(recorder):
  env, calls = recorder
  printed = launch(TPU, ['--dry-run', *TPU_ARGS, 'up', *TRAIN_FLAGS], env).stdout
  assert calls() == []  # A dry run runs nothing.
  commands = [shlex.split(line) for line in printed.splitlines()]
  gcloud = [c for c in commands if c[0] == 'gcloud']
  assert [c[:5] for c in gcloud] == [
      ['gcloud', 'compute', 'tpus', 'tpu-vm', sub]
      for sub in ('create', 'scp', 'ssh', 'ssh', 'ssh', 'ssh')
  ]
  create, scp, install, prepare, train, logs = gcloud
  assert {
      'vit-jax',
      '--accelerator-type=v4-32',
      '--version=tpu-ubuntu2204-base',
      '--zone=us-central2-b',
      '--project=my-project',
  } <= set(create)
  assert commands[1][:2] == ['git', '-C'] and 'HEAD' in commands[1]  # The archive to copy.
  assert '--worker=all' in scp and '--worker=all' in install and '--worker=all' in train
  assert '--worker=0' in prepare and '--worker=0' in logs

  def remote(command):
    return next(word[len('--command=') :] for word in command if word.startswith('--command='))

  pins = requirement_pins()
  assert f"'jax[tpu]=={pins['jax']}'" in remote(install)
  assert '-r ~/vit_jax/launch/requirements.txt' in remote(install)
  assert 'uv venv --python 3.12' in remote(install)
  assert (
      'launch/prepare_data.py --config=configs/vit.py:variant=S/4,dataset=cifar10 '
      '--data_dir=gs://my-bucket/tensorflow_datasets --config.batch_size=1024'
  ) in remote(prepare)
  assert (
      '~/venv/bin/python -m vit_jax.main --distributed=on '
      '--config=configs/vit.py:variant=S/4,dataset=cifar10 '
      '--workdir=gs://my-bucket/vit_jax/vit-jax '
      '--config.data_dir=gs://my-bucket/tensorflow_datasets '
      '--config.batch_size=1024 --config.base_lr=2e-3 > ~/vit_jax.log'
  ) in remote(train)
  assert 'tail -n +1 -F ~/vit_jax.log' in remote(logs)

  # The real run executes the very same commands.
  launch(TPU, [*TPU_ARGS, 'up', *TRAIN_FLAGS], env)
  assert calls() == gcloud
  assert os.path.exists(os.path.join(env['TMPDIR'], 'vit_jax-vit-jax.tar.gz'))


def test_tpu_stop_and_delete(recorder):
  env, calls = recorder
  for command in ('stop', 'delete'):
    printed = launch(TPU, ['--dry-run', '--name=my-tpu', command], env).stdout
    launch(TPU, ['--name=my-tpu', command], env)
    assert calls()[-1] == shlex.split(printed)
  stop, delete = calls()
  assert '--worker=all' in stop and any('kill -TERM $(cat ~/vit_jax.pid)' in w for w in stop)
  assert delete[:6] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'delete', 'my-tpu']


@pytest.mark.parametrize(
    'args, message',
    [
        (['train'], 'needs --bucket=gs://BUCKET'),
        (['--workdir=/local/run', '--data_dir=gs://b/tfds', 'train'], "workdir='/local/run'"),
        (['launch'], "unknown command 'launch'"),
        (['--zone', 'train'], 'unknown option --zone'),
    ],
)
def test_tpu_bad_arguments_are_refused(recorder, args, message):
  env, calls = recorder
  out = launch(TPU, ['--dry-run', *args], env, check=False)
  assert out.returncode == 2 and message in out.stderr
  assert calls() == []


SLURM_ARGS = [
    '--nodes=2',
    '--gpus_per_node=4',
    '--partition=gpu',
    '--account=vision',
    '--data_dir=/shared/tfds',
]


def test_slurm_dry_run_prints_the_batch_script_and_sbatch(recorder, tmp_path):
  env, calls = recorder
  workdir = str(tmp_path / 'runs' / 's16')
  args = [*SLURM_ARGS, f'--workdir={workdir}', 'submit', '--', '--config.batch_size=1024']
  printed = launch(SLURM, ['--dry-run', *args], env).stdout
  assert calls() == [] and not os.path.exists(workdir)
  lines = printed.splitlines()
  assert lines[0] == f'mkdir -p {workdir}'
  assert lines[1] == f"cat > {workdir}/job.sbatch <<'EOF'"
  end = lines.index('EOF')
  script = '\n'.join(lines[2:end]) + '\n'
  assert shlex.split(lines[end + 1]) == ['sbatch', f'{workdir}/job.sbatch']
  for directive in (
      '--nodes=2',
      '--ntasks-per-node=4',
      '--gpus-per-node=4',
      '--partition=gpu',
      '--account=vision',
      '--signal=TERM@300',
      f'--output={workdir}/slurm-%j.out',
  ):
    assert f'#SBATCH {directive}\n' in script
  srun = shlex.split(next(line for line in lines if line.startswith('srun ')))
  assert srun == [
      'srun',
      '--kill-on-bad-exit=1',
      'python',
      '-m',
      'vit_jax.main',
      '--config=configs/vit.py:variant=S/16,dataset=imagenet2012',
      f'--workdir={workdir}',
      '--config.data_dir=/shared/tfds',
      '--config.batch_size=1024',
      '||',
      'status=$?',
  ]
  # Exit status 75 (saved and interrupted: the time limit's SIGTERM) requeues the job.
  assert '#SBATCH --requeue\n' in script
  assert (
      'if [[ $status -eq 75 ]]; then scontrol requeue "$SLURM_JOB_ID"; fi\nexit $status\n' in script
  )
  assert f'source {env["HOME"]}/.venvs/vit_jax/bin/activate' in script

  # The real run writes that script and submits it.
  launch(SLURM, args, env)
  with open(os.path.join(workdir, 'job.sbatch')) as f:
    assert f.read() == script
  assert calls() == [['sbatch', f'{workdir}/job.sbatch']]
  out = subprocess.run(
      ['bash', '-n', os.path.join(workdir, 'job.sbatch')], capture_output=True, text=True
  )
  assert out.returncode == 0, out.stderr


def test_slurm_install_pins_the_tested_versions(recorder):
  env, _ = recorder
  printed = launch(SLURM, ['--dry-run', '--venv=/shared/venv', 'install'], env).stdout
  commands = [shlex.split(line) for line in printed.splitlines()]
  assert commands[0] == ['python3.12', '-m', 'venv', '/shared/venv']
  assert commands[-1] == [
      '/shared/venv/bin/pip',
      'install',
      '-r',
      os.path.join(REPO, 'launch', 'requirements.txt'),
      f'jax[cuda13]=={requirement_pins()["jax"]}',
      '-e',
      REPO,
  ]


@pytest.mark.parametrize(
    'args, message',
    [
        (['submit'], 'needs --workdir'),
        (['--nodes=0', '--workdir=/w'], "positive integers, got '0'"),
        (['--workdir=/w', 'run'], "unknown command 'run'"),
    ],
)
def test_slurm_bad_arguments_are_refused(recorder, args, message):
  env, calls = recorder
  out = launch(SLURM, ['--dry-run', *args], env, check=False)
  assert out.returncode == 2 and message in out.stderr
  assert calls() == []


def test_pins_satisfy_the_package_requirements():
  packaging = pytest.importorskip('packaging.requirements')
  with open(os.path.join(REPO, 'pyproject.toml')) as f:
    text = f.read()
  dependencies = text.split('dependencies = [', 1)[1].split(']', 1)[0]
  pins = requirement_pins()
  for line in dependencies.splitlines():
    line = line.split('#', 1)[0].strip().strip(',').strip('"')
    if not line:
      continue
    requirement = packaging.Requirement(line)
    assert requirement.name in pins, f'{requirement.name} has no pin in launch/requirements.txt'
    assert requirement.specifier.contains(pins[requirement.name]), (requirement, pins)


def test_prepare_data_prepares_the_config_dataset(tmp_path):
  data_dir = str(tmp_path / 'tfds')
  out = subprocess.run(
      [
          sys.executable,
          'launch/prepare_data.py',
          '--config=configs/vit.py',
          f'--data_dir={data_dir}',
      ],
      capture_output=True,
      text=True,
      cwd=REPO,
      timeout=180,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'),
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert f'Prepared digits in {data_dir}: 1437 train / 360 eval examples, 10 classes.' in out.stdout
  assert os.path.isdir(os.path.join(data_dir, 'digits', '1.0.0'))


def test_workdir_uris_stay_uris():
  """gs:// work directories (TPU VMs) are not turned into local paths; local ones are absolute."""
  assert (
      str(reader.Workdir('gs://bucket/run').file(run_files.CHECKPOINT_DIR))
      == 'gs://bucket/run/checkpoints'
  )
  assert str(reader.Workdir('run').file(run_files.CHECKPOINT_DIR)) == os.path.join(
      os.getcwd(), 'run', 'checkpoints'
  )
