r"""Compile time, step time and memory of deep models with and without scan-over-layers and remat.

  python benchmarks/scan_remat.py --models=cait_xxs24,deepvit_32b --batch=4 --steps=3

Each (model, scan_layers, remat) runs in its own process: one AdamW train step of
`vit_jax.train.make_train_step` at 224x224 (float32), timed as jitted init, trace+lower, XLA
compile (wall seconds, and CPU seconds of this process, which other work on the machine disturbs
less), and the median of `--steps` executed steps; memory is XLA's own account of the compiled step
(arguments, outputs and temporaries; `memory_analysis`) and the process's peak resident set. The
load average is printed beside every row.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(name: str, scan: bool, remat: bool, batch: int, steps: int, image_size: int) -> dict:
  """Times and sizes one configuration in this process."""
  sys.path.insert(0, REPO)
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from configs import common  # pylint: disable=g-import-not-at-top
  from vit_jax import train  # pylint: disable=g-import-not-at-top

  config = common.get_config()
  config.image_size = image_size
  config.batch_size = batch
  config.model.name = name
  config.model.scan_layers = scan
  config.model.remat = remat
  config.model.drop_path_rate = 0.1
  model = train.create_model(config, 1000)
  tx = train.create_optimizer(config, lambda _: 1e-4)

  start, cpu = time.perf_counter(), time.process_time()
  state = jax.jit(lambda: train.init_state(model, tx, config))()
  jax.block_until_ready(state)
  init_s, init_cpu = time.perf_counter() - start, time.process_time() - cpu

  rng = np.random.default_rng(0)
  data = {'image': jnp.asarray(rng.normal(size=(batch, image_size, image_size, 3)), jnp.float32),
          'label': jnp.asarray(rng.integers(0, 1000, size=(batch,)), jnp.int32)}
  step = jax.jit(train.make_train_step(model, tx, config, 1000), donate_argnums=0)
  start = time.perf_counter()
  lowered = step.lower(state, data)
  lower_s = time.perf_counter() - start
  start, cpu = time.perf_counter(), time.process_time()
  compiled = lowered.compile()
  compile_s, compile_cpu = time.perf_counter() - start, time.process_time() - cpu
  memory = compiled.memory_analysis()

  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = compiled(state, data)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  mib = lambda b: round(b / 2**20, 1)
  return {
      'model': name, 'scan': scan, 'remat': remat, 'batch': batch,
      'init_s': round(init_s, 1), 'init_cpu_s': round(init_cpu, 1), 'lower_s': round(lower_s, 1),
      'compile_s': round(compile_s, 1), 'compile_cpu_s': round(compile_cpu, 1),
      'step_s': round(float(np.median(times)), 2),
      'xla_temp_mib': mib(memory.temp_size_in_bytes),
      'xla_total_mib': mib(memory.temp_size_in_bytes + memory.argument_size_in_bytes
                           + memory.output_size_in_bytes - memory.alias_size_in_bytes),
      'peak_rss_mib': mib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
      'loss': float(metrics['loss']), 'load_avg_1m': round(os.getloadavg()[0], 1),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--models', default='cait_xxs24,deepvit_32b')
  parser.add_argument('--batch', type=int, default=4)
  parser.add_argument('--steps', type=int, default=3)
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--one', default='', help='model:scan:remat; run one row in this process')
  args = parser.parse_args()
  if args.one:
    name, scan, remat = args.one.split(':')
    print(json.dumps(measure(name, scan == '1', remat == '1', args.batch, args.steps,
                             args.image_size)))
    return
  header = ('model', 'scan', 'remat', 'init_s', 'init_cpu_s', 'lower_s', 'compile_s',
            'compile_cpu_s', 'step_s', 'xla_temp_mib', 'xla_total_mib', 'peak_rss_mib',
            'load_avg_1m')
  print(' | '.join(header))
  for name in args.models.split(','):
    for scan in (0, 1):
      for remat in (0, 1):
        out = subprocess.run(
            [sys.executable, __file__, f'--one={name}:{scan}:{remat}', f'--batch={args.batch}',
             f'--steps={args.steps}', f'--image_size={args.image_size}'],
            capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(' | '.join(str(row[k]) for k in header), flush=True)


if __name__ == '__main__':
  main()
