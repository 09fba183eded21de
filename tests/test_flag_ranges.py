"""Every numeric flag of every command has a range, and a value outside it is refused in one line
naming the flag and what is valid, when flags are parsed (before anything loads, trains or is
measured) instead of being replaced by a default or accepted."""

import json
import os

import pytest

from tests import tiny_runs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, 'configs', 'vit.py')
# Per command: the flags it requires, then each out-of-range value and a text its refusal holds.
CASES = {
    'benchmark': (
        [],
        {
            '--batch=0': 'positive integer',
            '--steps=0': 'positive integer',
            '--warmup=-1': 'non-negative integer',
            '--repeats=0': 'positive integer',
            '--image_size=0': 'positive integer',
            '--num_classes=0': 'positive integer',
            '--threads=0': 'positive integer',
            '--peak_tflops=0': 'must be > 0',
            '--family_models=': 'at least one',
            '--layers_models=': 'at least one',
            '--devices=0': 'positive integer',
            '--late_step=0': 'positive integer',
        },
    ),
    'analyze': (
        ['--workdir=/nonexistent'],
        {
            '--step=-1': 'non-negative integer',
            '--num_images=0': 'positive integer',
            '--batch_size=0': 'positive integer',
            '--window=0': 'positive integer',
            '--threshold=1.5': 'range [0.0, 1.0]',
            '--neighbours=0': 'positive integer',
            '--finetune_steps=-1': 'non-negative integer',
            '--finetune_lr_factor=0': 'must be > 0',
            '--what=': 'at least one analysis',
        },
    ),
    'predict': (
        ['--workdir=/nonexistent'],
        {
            '--top_k=0': 'positive integer',
            '--batch_size=0': 'positive integer',
            '--num_classes=0': 'positive integer',
            '--image_size=0': 'positive integer',
            '--eval_crop_ratio=0': '(0, 1]',
            '--eval_crop_ratio=1.5': '(0, 1]',
        },
    ),
    'evaluate': (
        ['--workdir=/nonexistent'],
        {'--evaluators=': 'at least one of fewshot'},
    ),
    'ablate': (
        [f'--config={CONFIG}', '--workdir=/nonexistent'],
        {
            '--timing_steps=0': 'positive integer',
            '--collapse_images=0': 'positive integer',
            '--seeds=0': 'positive integer',
        },
    ),
    'main': (
        [f'--config={CONFIG}', '--workdir=/nonexistent'],
        {'--num_processes=0': 'positive integer', '--process_id=-1': 'non-negative integer'},
    ),
    'export': (['--workdir=/nonexistent', '--out=/nonexistent/x.safetensors'], {}),
    'convert': (['--dataset=digits'], {}),
}
# Defines a command's flags (without running it), then parses each case as the command does.
_PARSE = """
import json, runpy, sys
from absl import flags
from vit_jax.process import runtime
command, required, cases = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
runpy.run_module(f'vit_jax.{command}', run_name='command')
modules = flags.FLAGS.flags_by_module_dict()
own = [f for m in ('command', 'vit_jax.weights.source_flags') for f in modules.get(m, [])]
unbounded = sorted(
    f.name for f in own
    if type(f.parser).__name__ in ('IntegerParser', 'FloatParser')
    and getattr(f.parser, 'lower_bound', None) is None and not f.validators
)
refusals = {}
for case in [None, *cases]:
  flags.FLAGS.unparse_flags()
  try:
    runtime.parse_flags([command, *required, *([case] if case else [])])
    refusals[case or ''] = None
  except SystemExit as e:
    refusals[case or ''] = str(e.code)
print(json.dumps({'unbounded': unbounded, 'refusals': refusals}))
"""


@pytest.fixture(scope='module')
def parsed() -> dict[str, dict]:
  """Each command's unbounded numeric flags and the refusal of each case, all at once."""
  env = dict(
      os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get('PYTHONPATH')]))
  )
  done = tiny_runs.run_at_once(
      {
          command: ['-c', _PARSE, command, json.dumps(required), json.dumps(list(cases))]
          for command, (required, cases) in CASES.items()
      },
      env,
  )
  results = {}
  for command, process in done.items():
    assert process.returncode == 0, process.stderr[-3000:]
    results[command] = json.loads(process.stdout.strip().splitlines()[-1])
  return results


@pytest.mark.e2e  # A process per command, as the commands parse their flags at import.
@pytest.mark.parametrize('command', CASES)
def test_every_numeric_flag_has_a_range(parsed, command):
  assert parsed[command]['unbounded'] == []


@pytest.mark.e2e
@pytest.mark.parametrize('command', CASES)
def test_a_flag_outside_its_range_is_one_line_naming_it_and_what_is_valid(parsed, command):
  refusals = parsed[command]['refusals']
  assert refusals.pop('') is None  # The required flags alone parse.
  for case, valid in CASES[command][1].items():
    refusal = refusals[case]
    assert refusal is not None, f'{command} {case} was accepted'
    assert '\n' not in refusal, refusal
    assert refusal.startswith(f'error: flag {case.split("=")[0]}='), refusal
    assert valid in refusal, refusal
