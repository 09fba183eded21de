"""Test sets a model is scored on, by name: `--config.eval_sets` (training, `vit_jax.evaluate`).

A set is named `DATASET[:SPLIT]`: any TFDS image-classification dataset ('imagenet_v2',
'imagenet_v2/topimages', 'cifar10:test', 'imagenet2012:validation'), the embedded 'digits', or an
image folder ('folder:/path/to/images:test'). Without a split: the run's `eval_split` for the run's
own dataset, the published split for the ImageNet test sets of `eval_set_names.PUBLISHED`, else
'test'. How each set is scored (`eval_set_names.SCORINGS`):
* 'top1': the argmax of the logits equals the label (ImageNet, -v2, -Sketch, any other dataset);
* 'real': ImageNet-ReaL (Beyer et al. 2020, "Are we done with ImageNet?"): correct when the argmax
  is one of the example's ReaL labels; examples without a ReaL label are left out, as there;
* 'imagenet_a', 'imagenet_r': the argmax over the logits of the set's 200 ImageNet classes only, the
  1000-way head restricted to them (timm validate.py's `indices_in_1k`); an example labelled
  outside them (none in the published sets) is left out.
Each set's metrics are reported under its name as written: 'imagenet_v2/accuracy', 'loss',
'count' (the examples scored) and, with an EMA, 'ema_accuracy' and 'ema_loss'. `TestSets`, the
evaluator of a model's predictions, scores them and the run's own eval split.
"""

import dataclasses
import functools
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit_jax.schema import dataset_names as datasets
from vit_jax.schema import eval_set_names
from vit_jax.data import imagenet
from vit_jax.data import input_pipeline
from vit_jax.schema import data as data_settings
from vit_jax.evaluators import evaluator
from vit_jax.evaluators import passes
from vit_jax.parallel import sharding
from vit_jax.schema import evaluators as evaluator_settings

# The 200 ImageNet classes (WordNet ids) of ImageNet-A (Hendrycks et al. 2021, "Natural Adversarial
# Examples", github.com/hendrycks/natural-adv-examples) and ImageNet-R (Hendrycks et al. 2021, "The
# Many Faces of Robustness", github.com/hendrycks/imagenet-r), as timm lists them in
# timm/data/_info/imagenet_{a,r}_synsets.txt; their indices among the 1000 are `subset_classes`.
IMAGENET_A_WNIDS = tuple(
    """
n01498041 n01531178 n01534433 n01558993 n01580077 n01614925 n01616318 n01631663 n01641577
n01669191 n01677366 n01687978 n01694178 n01698640 n01735189 n01770081 n01770393 n01774750
n01784675 n01819313 n01820546 n01833805 n01843383 n01847000 n01855672 n01882714 n01910747
n01914609 n01924916 n01944390 n01985128 n01986214 n02007558 n02009912 n02037110 n02051845
n02077923 n02085620 n02099601 n02106550 n02106662 n02110958 n02119022 n02123394 n02127052
n02129165 n02133161 n02137549 n02165456 n02174001 n02177972 n02190166 n02206856 n02219486
n02226429 n02231487 n02233338 n02236044 n02259212 n02268443 n02279972 n02280649 n02281787
n02317335 n02325366 n02346627 n02356798 n02361337 n02410509 n02445715 n02454379 n02486410
n02492035 n02504458 n02655020 n02669723 n02672831 n02676566 n02690373 n02701002 n02730930
n02777292 n02782093 n02787622 n02793495 n02797295 n02802426 n02814860 n02815834 n02837789
n02879718 n02883205 n02895154 n02906734 n02948072 n02951358 n02980441 n02992211 n02999410
n03014705 n03026506 n03124043 n03125729 n03187595 n03196217 n03223299 n03250847 n03255030
n03291819 n03325584 n03355925 n03384352 n03388043 n03417042 n03443371 n03444034 n03445924
n03452741 n03483316 n03584829 n03590841 n03594945 n03617480 n03666591 n03670208 n03717622
n03720891 n03721384 n03724870 n03775071 n03788195 n03804744 n03837869 n03840681 n03854065
n03888257 n03891332 n03935335 n03982430 n04019541 n04033901 n04039381 n04067472 n04086273
n04099969 n04118538 n04131690 n04133789 n04141076 n04146614 n04147183 n04179913 n04208210
n04235860 n04252077 n04252225 n04254120 n04270147 n04275548 n04310018 n04317175 n04344873
n04347754 n04355338 n04366367 n04376876 n04389033 n04399382 n04442312 n04456115 n04482393
n04507155 n04509417 n04532670 n04540053 n04554684 n04562935 n04591713 n04606251 n07583066
n07695742 n07697313 n07697537 n07714990 n07718472 n07720875 n07734744 n07749582 n07753592
n07760859 n07768694 n07831146 n09229709 n09246464 n09472597 n09835506 n11879895 n12057211
n12144580 n12267677
""".split()
)
IMAGENET_R_WNIDS = tuple(
    """
n01443537 n01484850 n01494475 n01498041 n01514859 n01518878 n01531178 n01534433 n01614925
n01616318 n01630670 n01632777 n01644373 n01677366 n01694178 n01748264 n01770393 n01774750
n01784675 n01806143 n01820546 n01833805 n01843383 n01847000 n01855672 n01860187 n01882714
n01910747 n01944390 n01983481 n01986214 n02007558 n02009912 n02051845 n02056570 n02066245
n02071294 n02077923 n02085620 n02086240 n02088094 n02088238 n02088364 n02088466 n02091032
n02091134 n02092339 n02094433 n02096585 n02097298 n02098286 n02099601 n02099712 n02102318
n02106030 n02106166 n02106550 n02106662 n02108089 n02108915 n02109525 n02110185 n02110341
n02110958 n02112018 n02112137 n02113023 n02113624 n02113799 n02114367 n02117135 n02119022
n02123045 n02128385 n02128757 n02129165 n02129604 n02130308 n02134084 n02138441 n02165456
n02190166 n02206856 n02219486 n02226429 n02233338 n02236044 n02268443 n02279972 n02317335
n02325366 n02346627 n02356798 n02363005 n02364673 n02391049 n02395406 n02398521 n02410509
n02423022 n02437616 n02445715 n02447366 n02480495 n02480855 n02481823 n02483362 n02486410
n02510455 n02526121 n02607072 n02655020 n02672831 n02701002 n02749479 n02769748 n02793495
n02797295 n02802426 n02808440 n02814860 n02823750 n02841315 n02843684 n02883205 n02906734
n02909870 n02939185 n02948072 n02950826 n02951358 n02966193 n02980441 n02992529 n03124170
n03272010 n03345487 n03372029 n03424325 n03452741 n03467068 n03481172 n03494278 n03495258
n03498962 n03594945 n03602883 n03630383 n03649909 n03676483 n03710193 n03773504 n03775071
n03888257 n03930630 n03947888 n04086273 n04118538 n04133789 n04141076 n04146614 n04147183
n04192698 n04254680 n04266014 n04275548 n04310018 n04325704 n04347754 n04389033 n04409515
n04465501 n04487394 n04522168 n04536866 n04552348 n04591713 n07614500 n07693725 n07695742
n07697313 n07697537 n07714571 n07714990 n07718472 n07720875 n07734744 n07742313 n07745940
n07749582 n07753275 n07753592 n07768694 n07873807 n07880968 n07920052 n09472597 n09835506
n10565667 n12267677
""".split()
)
SUBSET_WNIDS = {'imagenet_a': IMAGENET_A_WNIDS, 'imagenet_r': IMAGENET_R_WNIDS}


@functools.cache
def subset_classes(scoring: str) -> tuple[int, ...]:
  """The indices among the 1000 ImageNet classes (TFDS label order) of the 200 classes of
  'imagenet_a' or 'imagenet_r', ascending."""
  names = imagenet.class_names()
  return tuple(names.index(wnid) for wnid in SUBSET_WNIDS[scoring])


def real_sums(logits: jax.Array, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """ReaL top-1: the argmax is one of the example's labels ('label_set', (B, classes) bool);
  examples without a label are not counted."""
  labelled = jnp.any(batch['label_set'], -1) & (batch['mask'] > 0)
  predicted = jnp.argmax(logits, -1)
  hit = jnp.take_along_axis(batch['label_set'], predicted[:, None], -1)[:, 0]
  return {'correct': jnp.sum(hit & labelled), 'count': jnp.sum(labelled)}


def subset_sums(
    logits: jax.Array, batch: dict[str, jax.Array], classes: Sequence[int]
) -> dict[str, jax.Array]:
  """Top-1 and cross-entropy over the logits of `classes` only (labels index all the logits);
  examples labelled outside `classes` are not counted."""
  indices = jnp.asarray(classes)
  position = jnp.full(logits.shape[-1], -1).at[indices].set(jnp.arange(len(indices)))
  target = position[batch['label']]
  scored = (target >= 0) & (batch['mask'] > 0)
  restricted = logits[:, indices]
  loss = optax.softmax_cross_entropy_with_integer_labels(restricted, jnp.maximum(target, 0))
  return {
      'correct': jnp.sum((jnp.argmax(restricted, -1) == target) & scored),
      'loss': jnp.sum(jnp.where(scored, loss, 0.0)),
      'count': jnp.sum(scored),
  }


class EvalSet(eval_set_names.EvalSetName):
  """One test set (`eval_set_names.EvalSetName`) and the batches it reads."""

  @property
  def source(self) -> dict[str, Any]:
    """What `input_pipeline` reads of it: its dataset, split and label keys."""
    keys = ('dataset', 'split', 'label_key', 'label_set_key')
    return {key: getattr(self, key) for key in keys}

  def batches(self, data: data_settings.DataSettings) -> Iterator[dict[str, np.ndarray]]:
    """One padded pass over the set, preprocessed as the run `data` evaluates."""
    return input_pipeline.eval_iterator(data, **self.source)


@functools.cache
def score(scoring: str) -> passes.Score:
  """The `passes.Score` of one of `eval_set_names.SCORINGS` (one object each, so that its jitted
  step is compiled once)."""
  if scoring == 'real':
    return real_sums
  if scoring in SUBSET_WNIDS:
    return functools.partial(subset_sums, classes=subset_classes(scoring))
  return passes.top1_sums


def parse_all(
    specs: Sequence[str], *, dataset: str = '', eval_split: str = 'test'
) -> tuple[EvalSet, ...]:
  """The sets of a list of names (`eval_set_names.parse_all`)."""
  names = eval_set_names.parse_all(specs, dataset=dataset, eval_split=eval_split)
  return tuple(EvalSet(**dataclasses.asdict(name)) for name in names)


def _named(dataset: str, names: Sequence[str]) -> bool:
  """Whether `names` are a dataset's own class names, not TFDS's indices of unnamed labels."""
  return (
      dataset == datasets.DIGITS
      or dataset.startswith(datasets.FOLDER_PREFIX)
      or tuple(names) != tuple(str(i) for i in range(len(names)))
  )


def class_difference(model: Sequence[str], found: Sequence[str]) -> str | None:
  """How the class names `found` (an eval set's, by label index) differ from the `model`'s, in
  words; None where they are the same in the same order, so that scoring by index is right."""
  model, found = tuple(model), tuple(found)
  if model == found:
    return None
  shown = lambda names: ', '.join(names[:8]) + (
      f', … ({len(names) - 8} more)' if len(names) > 8 else ''
  )
  if sorted(model) == sorted(found):
    index = next(i for i, (a, b) in enumerate(zip(model, found)) if a != b)
    return (
        f'the same {len(model)} classes in another order (index {index}: {found[index]!r} there, '
        f'{model[index]!r} in the model)'
    )
  only_set = [n for n in found if n not in set(model)]
  only_model = [n for n in model if n not in set(found)]
  return (
      f'classes {shown(only_set) or "none"} there are not the model\'s, which has '
      f'{shown(only_model) or "none"} instead'
  )


def checked(
    specs: Sequence[str],
    data: data_settings.DataSettings,
    *,
    num_classes: int,
    class_names: Sequence[str] | None = None,
) -> tuple[EvalSet, ...]:
  """The sets of `specs` beside the run reading `data`, checked before anything compiles: the
  dataset and split exist, `num_classes` classes and, where both sides name their classes
  (`class_names`: the run's), the same names in the same order (sets are scored by label index)."""
  try:
    eval_sets = parse_all(specs, dataset=data.dataset, eval_split=data.eval_split)
  except ValueError as e:
    raise ValueError(f'eval_sets: {e}.') from None
  for eval_set in eval_sets:
    classes = input_pipeline.eval_num_classes(data, **eval_set.source)
    if classes != num_classes:
      raise ValueError(
          f'eval_sets: {eval_set.name!r} has {classes} classes, but the model '
          f'predicts {num_classes} (of {data.dataset!r}); evaluate it with a model '
          f'of {classes} classes.'
      )
    if class_names is None or eval_set.scoring != 'top1' or eval_set.label_key:
      continue  # The ImageNet sets of `eval_set_names.PUBLISHED`, scored by their own labels.
    names = input_pipeline.get_dataset_info(
        dataclasses.replace(
            data, dataset=eval_set.dataset, train_split=eval_set.split, eval_split=eval_set.split
        )
    ).class_names
    named = _named(eval_set.dataset, names) and _named(data.dataset, class_names)
    difference = class_difference(class_names, names) if named else None
    if difference is not None:
      raise ValueError(
          f'eval_sets: {eval_set.name!r} names its classes differently from the model (of '
          f'{data.dataset!r}), which it would score by label index: {difference}; name its '
          'class folders as the training classes, or evaluate it with a model trained on them.'
      )
  return eval_sets


def compile_steps(
    eval_sets: Sequence[EvalSet],
    model: nn.Module,
    num_classes: int,
    mesh: jax.sharding.Mesh,
    own_split: bool = False,
) -> dict[str, Callable]:
  """The jitted eval step of each scoring the sets use (and top-1 for the run's `own_split`)."""
  scorings = {s.scoring for s in eval_sets} | ({'top1'} if own_split else set())
  return {s: passes.jitted_eval_step(model, num_classes, mesh, score(s)) for s in sorted(scorings)}


@dataclasses.dataclass(frozen=True)
class TestSets(evaluator_settings.TestSetsSettings):
  """The model's predictions scored: top-1 and loss on the run's eval split where `own_split`
  ('accuracy', 'loss', 'count'; 'ema_accuracy', 'ema_loss' with an EMA) and on each of `sets`
  ('NAME/…'). `vit_jax.evaluate` leaves out the run's own split, which the run scored."""

  name: ClassVar[str] = 'test_sets'
  own_split: bool = True

  def check(
      self,
      data: data_settings.DataSettings,
      *,
      num_classes: int,
      class_names: Sequence[str] | None,
  ) -> None:
    evaluator.check_head(self.name, num_classes)
    if not (self.sets or self.own_split):
      raise ValueError('test_sets has no test set to score: name them in --config.eval_sets.')
    checked(self.sets, data, num_classes=num_classes, class_names=class_names)

  def run(self, subject: evaluator.Subject) -> dict[str, float]:
    data = subject.data
    sets = parse_all(self.sets, dataset=data.dataset, eval_split=data.eval_split)
    eval_steps = compile_steps(
        sets, subject.model, subject.num_classes, subject.mesh, own_split=self.own_split
    )
    evaluate = lambda scoring, batches: passes.evaluate_with_ema(
        eval_steps[scoring], subject.state, batches, sharding.batch_sharding(subject.mesh)
    )
    metrics, known = {}, {}
    if self.own_split:
      metrics = evaluate('top1', functools.partial(input_pipeline.eval_iterator, data))
      # The run's own eval split as a test set: a listed set that reads it is not read again.
      known = {EvalSet(data.eval_split, data.dataset, data.eval_split).reads: dict(metrics)}
    for eval_set in sets:
      result = known.get(eval_set.reads) or evaluate(
          eval_set.scoring, functools.partial(eval_set.batches, data)
      )
      metrics.update({f'{eval_set.name}/{k}': v for k, v in result.items()})
    return metrics

  def log(self, step: int, metrics: Mapping[str, float], *, final: bool) -> None:
    ema_note = lambda prefix='': (
        f'; EMA accuracy {metrics[prefix + "ema_accuracy"]:.4f}'
        if prefix + 'ema_accuracy' in metrics
        else ''
    )
    if self.own_split and final:
      logging.info(
          'Final test accuracy: %.4f (%d examples, step %d)%s.',
          metrics['accuracy'],
          metrics['count'],
          step,
          ema_note(),
      )
    elif self.own_split:
      logging.info(
          'step %d  test accuracy %.4f  test loss %.4f%s',
          step,
          metrics['accuracy'],
          metrics['loss'],
          ema_note(),
      )
    for name in self.sets:  # Each set's metrics are under its name as written.
      prefix = f'{name}/'
      logging.info(
          'step %d  %s accuracy %.4f (%d examples scored)%s',
          step,
          name,
          metrics[prefix + 'accuracy'],
          metrics[prefix + 'count'],
          ema_note(prefix),
      )

  def summaries(self, metrics: Mapping[str, float]) -> dict[str, float]:
    return {f'eval/{k}': v for k, v in metrics.items()}

  def results(self, metrics: Mapping[str, float]) -> dict[str, float]:
    """The eval split's metrics as 'test_accuracy', …; each set's as they are ('NAME/…')."""
    return {k if '/' in k else f'test_{k}': v for k, v in metrics.items()}
