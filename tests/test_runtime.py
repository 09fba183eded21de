"""Process settings for fast CPU training: XLA flags that this jaxlib knows, glibc malloc reuse."""

import platform
import subprocess
import sys

import pytest

from vit_jax import runtime


def test_flags_are_added_once_and_never_override_the_user(monkeypatch):
  monkeypatch.setenv('XLA_FLAGS', '--xla_dump_to=/tmp/dump')
  flags = runtime.add_xla_flags({'--xla_cpu_experimental_ynn_fusion_type=': (0,)})
  assert flags == '--xla_dump_to=/tmp/dump --xla_cpu_experimental_ynn_fusion_type='
  assert runtime.add_xla_flags({'--xla_cpu_experimental_ynn_fusion_type=': (0,)}) == flags

  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_experimental_ynn_fusion_type=dot')
  assert (runtime.add_xla_flags({'--xla_cpu_experimental_ynn_fusion_type=': (0,)})
          == '--xla_cpu_experimental_ynn_fusion_type=dot')


def test_flags_unknown_to_the_installed_jaxlib_are_left_out(monkeypatch):
  monkeypatch.delenv('XLA_FLAGS', raising=False)
  assert runtime.add_xla_flags({'--xla_from_the_future=1': (999, 0, 0)}) == ''
  assert runtime._jaxlib_version() >= (0, 7)  # pylint: disable=protected-access


@pytest.mark.skipif(platform.system() != 'Linux' or platform.libc_ver()[0] != 'glibc',
                    reason='glibc malloc settings')
def test_configure_keeps_freed_memory_and_jax_still_runs():
  code = ('from vit_jax import runtime; applied = runtime.configure(); '
          'import jax.numpy as jnp; assert float(jnp.ones(3).sum()) == 3.0; print(applied)')
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          check=False, timeout=300)
  assert result.returncode == 0, result.stderr
  assert "'keep_freed_host_memory': True" in result.stdout
