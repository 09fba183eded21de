"""Shared pytest fixtures, and one XLA compilation cache for the session."""

import functools
import gc
import inspect
import os
import pathlib
import re
import shutil
import tempfile

import pytest

from vit_jax.process import runtime

# Tracing JAX programs allocates objects by the million: at Python's default threshold (700) the
# garbage collector runs thousands of times a test module, each time walking every object that the
# imports (TensorFlow, JAX, torch) and the tracing made. A collection every 10,000 allocations
# frees the same garbage (a test that needs it freed at once calls gc.collect()) far less often.
gc.set_threshold(10_000, *gc.get_threshold()[1:])

# Many tests compile the same small programs (in this process, in subprocesses and in notebook
# kernels, which inherit the environment): a session-wide persistent cache compiles each once.
os.environ.setdefault(
    'JAX_COMPILATION_CACHE_DIR', tempfile.mkdtemp(prefix='vit_jax_test_xla_cache_')
)
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
COMPILATION_CACHE = (
    'JAX_COMPILATION_CACHE_DIR',
    'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS',
    'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES',
)

# The tests check what programs compute, not how fast they run: without its costly optimisation
# passes XLA's CPU compiler builds the suite's many small programs in far less time. Subprocesses
# and notebook kernels inherit it; flags the user set come after it, and so win.
FAST_COMPILE = '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true'
# Unoptimised, XLA's older CPU emitters build (and run) these programs quicker than its fusion
# emitters. XLA aborts on a flag it does not know: only the jaxlibs that have it (0.10 and 0.11;
# 0.12 removed the older emitters) get it. They do not reduce alike on one device and across
# several, so the tests that compare device counts or processes drop them (`OLDER_EMITTERS`) and
# compile as users' runs do.
OLDER_EMITTERS = '--xla_cpu_use_fusion_emitters=false'
if (0, 10, 0) <= runtime.jaxlib_version() < (0, 12, 0):
  FAST_COMPILE += f' {OLDER_EMITTERS}'
os.environ['XLA_FLAGS'] = f"{FAST_COMPILE} {os.environ.get('XLA_FLAGS', '')}".strip()


def without_cluster_settings(environ) -> dict[str, str]:
  """`environ` without the variables that make a process join a cluster (SLURM_*, JAX_*), but
  with the suite's compilation cache (`COMPILATION_CACHE`): for the processes of multi-process
  runs started by hand."""
  return {
      k: v
      for k, v in environ.items()
      if k in COMPILATION_CACHE or not k.startswith(('SLURM_', 'JAX_'))
  }


def copy_of_project(dest: pathlib.Path) -> pathlib.Path:
  """`dest` holding what `pip install .` of this checkout reads (the package, pyproject.toml,
  README.md), so that installing it builds nothing inside the checkout."""
  repo = pathlib.Path(__file__).resolve().parent.parent
  shutil.copytree(repo / 'vit_jax', dest / 'vit_jax', ignore=shutil.ignore_patterns('__pycache__'))
  for name in ('pyproject.toml', 'README.md'):
    shutil.copy(repo / name, dest / name)
  return dest


# The two tiers. Plain `pytest` runs the unit and integration tests (in-process, tiny models);
# `pytest -m e2e` runs the end-to-end tier: what starts a process (the commands as a user runs
# them, kills, several processes, notebooks, installs) or runs a whole command in-process. A test
# lands in the end-to-end tier by what it does: by starting a Python process (`starts_python`: its
# code, the test helpers and fixtures it calls), by using a fixture of `E2E_FIXTURES`, or by its
# `e2e` mark (a training to an accuracy, a config's quick default, the device report). One that
# starts a Python process unseen fails, naming the mark (`_python_processes_are_end_to_end`).
E2E_FIXTURES = frozenset({'trained_digits_run'})
_TESTS = os.path.dirname(os.path.abspath(__file__)) + os.sep
# What starting a Python process looks like in a test's code: the interpreter, a notebook kernel.
_STARTS_PYTHON = re.compile(r'\bsys\.executable\b|\bnbclient\b')


def pytest_configure(config):
  config.addinivalue_line(
      'markers',
      'e2e: the end-to-end tier (`pytest -m e2e`): starts Python processes or trains to an '
      'accuracy; plain `pytest` leaves it out',
  )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
  """Marks end-to-end the tests that start Python or use `E2E_FIXTURES`; sends the tests that
  share a costly fixture to one xdist worker (`--dist loadgroup`), so that it is built once: those
  of `trained_digits_run` together, and those of a module-scoped fixture with the rest of their
  module; and schedules the modules with end-to-end tests first."""
  for item in items:
    fixtures = [
        definitions[-1].func
        for name, definitions in item._fixtureinfo.name2fixturedefs.items()  # pylint: disable=protected-access
        if name != '_python_processes_are_end_to_end'
    ]
    if E2E_FIXTURES & set(item.fixturenames) or any(
        starts_python(f) for f in [getattr(item, 'function', None), *fixtures] if f
    ):
      item.add_marker(pytest.mark.e2e)
    group = None
    for name, definitions in item._fixtureinfo.name2fixturedefs.items():  # pylint: disable=protected-access
      if name == 'trained_digits_run':
        group = name
        break
      if definitions[-1].scope == 'module':
        group = item.nodeid.split('::')[0]
    if group:
      item.add_marker(pytest.mark.xdist_group(group))
  # The modules with a long test first (each module's tests kept together and in order), so that
  # no worker starts a long test while the other runs out of work.
  long_modules = {item.module.__name__ for item in items if item.get_closest_marker('e2e')}
  items.sort(key=lambda item: item.module.__name__ not in long_modules)


@functools.cache
def starts_python(function) -> bool:
  """Whether `function`, a test or fixture, or a test helper it names (defined under `tests/`),
  starts a Python process."""
  try:
    if not os.path.abspath(inspect.getsourcefile(function)).startswith(_TESTS):
      return False
    source = inspect.getsource(function)
  except (OSError, TypeError):
    return False
  if _STARTS_PYTHON.search(source):
    return True
  module = inspect.getmodule(function)
  for name in set(re.findall(r'\b[A-Za-z_][\w.]*', source)):
    helper = module
    for part in name.split('.'):
      helper = getattr(helper, part, None)
    helper = inspect.unwrap(getattr(helper, '__func__', helper)) if callable(helper) else None
    if helper is not function and inspect.isfunction(helper) and starts_python(helper):
      return True
  return False


@pytest.fixture(autouse=True)
def _python_processes_are_end_to_end(request, monkeypatch):
  """Fails a test outside the end-to-end tier at the moment it starts a Python process that
  `starts_python` did not see, naming the mark it needs."""
  if request.node.get_closest_marker('e2e'):
    return
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  start = subprocess.Popen.__init__

  def refuse_python(self, args, *rest, **kwargs):
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    program = os.path.basename(str(argv[0])) if argv else ''
    is_python = str(argv[0]) == sys.executable or program.startswith('python')
    if is_python:
      raise RuntimeError(
          f'{request.node.nodeid} starts a Python process ({" ".join(map(str, argv[:3]))} …): '
          'that is an end-to-end test; mark it @pytest.mark.e2e (run by `pytest -m e2e`).'
      )
    start(self, args, *rest, **kwargs)

  monkeypatch.setattr(subprocess.Popen, '__init__', refuse_python)


@pytest.fixture(scope='session')
def jpeg_folder(tmp_path_factory):
  """(root, data_dir): an image folder of 3 classes x (10 train + 2 test) JPEGs of random pixels,
  17..40 px on a side, and an empty TFDS data dir to prepare it in."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.mktemp('jpegs')
  rng = np.random.default_rng(0)
  for split, count in (('train', 10), ('test', 2)):
    for c in range(3):
      (root / split / f'class{c}').mkdir(parents=True)
      for i in range(count):
        height, width = rng.integers(17, 41, 2)
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / split / f'class{c}' / f'{i}.jpg')
  return str(root), str(tmp_path_factory.mktemp('tfds_jpegs'))


@pytest.fixture(scope='session')
def timm():
  """The timm package, offline, on CPU torch; skips the test where torch or timm is absent."""
  os.environ.setdefault('HF_HUB_OFFLINE', '1')
  pytest.importorskip('torch')
  from vit_jax.benchmarks import timm_reference  # pylint: disable=g-import-not-at-top

  try:
    return timm_reference.import_timm()
  except ImportError as e:
    pytest.skip(f'timm is not installed ({e})')


@pytest.fixture(scope='session')
def timm_model(timm):
  """Builds a randomly initialised timm model with every float tensor perturbed (so biases, norms
  and running statistics are non-trivial), in eval mode, with its state dict as NumPy arrays."""
  import torch  # pylint: disable=g-import-not-at-top

  def build(name: str, **kwargs):
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **kwargs)
    with torch.no_grad():
      for tensor in model.state_dict().values():
        if tensor.is_floating_point():  # Not BatchNorm's step counter.
          tensor.add_(0.05 * torch.randn_like(tensor))
    state_dict = {key: value.numpy().copy() for key, value in model.state_dict().items()}
    return model.eval(), state_dict

  return build


@pytest.fixture
def train_losses(monkeypatch):
  """The mean training loss of every logging window of the runs made in the test, in order."""
  from clu import metric_writers  # pylint: disable=g-import-not-at-top

  losses = []
  original = metric_writers.SummaryWriter.write_scalars

  def record(self, step, scalars):
    if 'train/loss' in scalars:
      losses.append(scalars['train/loss'])
    return original(self, step, scalars)

  monkeypatch.setattr(metric_writers.SummaryWriter, 'write_scalars', record)
  return losses


@pytest.fixture
def fit_one_batch():
  """Takes `steps` Adam steps of `model` (train=True, dropout on) on one batch; returns the losses."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  def fit(model, images, labels, steps: int = 15, learning_rate: float = 3e-3) -> list[float]:
    params = jax.jit(model.init)(jax.random.key(0), images)['params']
    optimizer = optax.adam(learning_rate)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, rng):
      def loss_fn(p):
        logits = model.apply({'params': p}, images, train=True, rngs={'dropout': rng})
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

      loss, grads = jax.value_and_grad(loss_fn)(params)
      updates, opt_state = optimizer.update(grads, opt_state)
      return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for i in range(steps):
      params, opt_state, loss = step(params, opt_state, jax.random.key(i))
      losses.append(float(loss))
    return losses

  return fit


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory) -> str:
  """A TFDS data dir with the embedded digits prepared, shared by the session's tiny trainings."""
  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top

  path = str(tmp_path_factory.mktemp('tfds'))
  digits.prepare(path)
  return path


@pytest.fixture(scope='session')
def trained_digits_run(data_dir, tmp_path_factory) -> str:
  """The work directory of `tiny_runs.digits_run_config(data_dir)`: a small ViT trained on the
  embedded digits to ~0.95 test accuracy (as a user runs it, `tiny_runs.train_as_a_user`), with
  the few-shot evaluator run by the loop at steps 400 and 800 and the linear probe at the end. It
  is also the float32 seed 0 run that bfloat16 training is compared with."""
  from tests import tiny_runs  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path_factory.mktemp('trained_digits_run'))
  tiny_runs.train_as_a_user(tiny_runs.DIGITS_RUN_CONFIG, workdir, f'--config.data_dir={data_dir}')
  return workdir


@pytest.fixture(scope='session')
def checkpointed_run(data_dir, tmp_path_factory) -> str:
  """The work directory of a finished `tiny_runs.checkpointed_config` run, with checkpoints at
  `tiny_runs.CHECKPOINTED_STEPS`. Shared by the session: a test that writes to it (resumes,
  corrupts, analyses) works on a copy (`shutil.copytree`)."""
  from tests import tiny_runs  # pylint: disable=g-import-not-at-top
  from vit_jax.loop import train  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path_factory.mktemp('checkpointed_run') / 'run')
  train.train_and_evaluate(tiny_runs.checkpointed_config(data_dir), workdir)
  saved = sorted(int(step) for step in os.listdir(os.path.join(workdir, 'checkpoints')))
  assert saved == list(tiny_runs.CHECKPOINTED_STEPS)
  return workdir


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
  """An empty Hugging Face cache (huggingface_hub's layout, under $HF_HOME/hub), read offline
  (HF_HUB_OFFLINE=1) for the test. Returns `publish(repo_id, timm_model, label_names=None)`,
  which stores the model there as timm's `save_for_hf` writes a Hub repository (config.json,
  model.safetensors) under refs/main and snapshots/REVISION, and returns the snapshot folder."""
  import hashlib  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  from huggingface_hub import constants  # pylint: disable=g-import-not-at-top

  home = tmp_path / 'hf_home'
  cache = home / 'hub'
  cache.mkdir(parents=True)
  for variable, value in (
      ('HF_HOME', str(home)),
      ('HF_HUB_CACHE', str(cache)),
      ('HF_HUB_OFFLINE', '1'),
  ):
    monkeypatch.setenv(variable, value)
  # huggingface_hub read the environment when imported: its constants say the same.
  monkeypatch.setattr(constants, 'HF_HUB_CACHE', str(cache))
  monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', True)

  def publish(repo_id: str, model, label_names=None):
    from timm import models as timm_models  # pylint: disable=g-import-not-at-top

    org, name = repo_id.split('/')
    repo = cache / f'models--{org}--{name}'
    revision = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / 'snapshots' / revision
    timm_models.save_for_hf(model, str(snapshot), safe_serialization=True)
    if label_names is not None:
      config = json.loads((snapshot / 'config.json').read_text())
      config['label_names'] = list(label_names)
      (snapshot / 'config.json').write_text(json.dumps(config, indent=2))
    (repo / 'refs').mkdir()
    (repo / 'refs' / 'main').write_text(revision)
    return snapshot

  return publish


@pytest.fixture
def evaluator_registry(monkeypatch):
  """The evaluators registered during the test are gone after it, from the config's section too."""
  from vit_jax import evaluators  # pylint: disable=g-import-not-at-top
  from vit_jax.schema import evaluators as evaluator_settings  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(evaluators, 'EVALUATORS', dict(evaluators.EVALUATORS))
  registries = (evaluator_settings.SECTION, evaluator_settings.RUN_FIELDS)
  saved = [dict(registry) for registry in registries]
  yield evaluators
  for registry, entries in zip(registries, saved):
    registry.clear()
    registry.update(entries)
