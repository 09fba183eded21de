"""The commands, read from the source of vit_jax/ (nothing imported): the modules at its top whose
`if __name__ == '__main__':` block starts through `runtime.run`, each run as
`python -m vit_jax.NAME`. A new command is its module alone."""

import ast
import functools
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / 'vit_jax'


def _is_main_block(node: ast.stmt) -> bool:
  """Whether `node` is `if __name__ == '__main__':`."""
  if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
    return False
  sides = [node.test.left, *node.test.comparators]
  return any(isinstance(s, ast.Name) and s.id == '__name__' for s in sides) and any(
      isinstance(s, ast.Constant) and s.value == '__main__' for s in sides
  )


def _starts_through_runtime_run(source: str) -> bool:
  """Whether a module's `__main__` block calls `runtime.run`."""
  return any(
      isinstance(call, ast.Call)
      and isinstance(call.func, ast.Attribute)
      and call.func.attr == 'run'
      and isinstance(call.func.value, ast.Name)
      and call.func.value.id == 'runtime'
      for block in ast.parse(source).body
      if _is_main_block(block)
      for call in ast.walk(block)
  )


@functools.cache
def names() -> tuple[str, ...]:
  """Every command's module name ('main' for vit_jax/main.py), sorted."""
  return tuple(
      sorted(
          path.stem
          for path in PACKAGE.glob('*.py')
          if '__main__' in (source := path.read_text()) and _starts_through_runtime_run(source)
      )
  )
