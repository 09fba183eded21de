"""Frozen pre-logits features of a dataset split, and the evaluators that fit classifiers on them
(`Evaluator`, the base of few-shot and linear probes)."""

import abc
import dataclasses
import functools
import os
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np

from vit_jax.schema import dataset_names
from vit_jax.data import input_pipeline
from vit_jax.schema import data as data_settings
from vit_jax.evaluators import evaluator
from vit_jax.models import features
from vit_jax.schema import evaluators as evaluator_settings


@dataclasses.dataclass(frozen=True)
class Split:
  """The frozen pre-logits (examples, width) and labels (examples,) of one split."""

  features: np.ndarray
  labels: np.ndarray


@dataclasses.dataclass(frozen=True)
class Dataset:
  """The train and test splits of one dataset, as an evaluator fits and scores on them."""

  name: str  # For metric names: the dataset, or a folder's base name.
  num_classes: int
  train: Split
  test: Split


def metric_name(dataset: str) -> str:
  """'cifar10' -> 'cifar10'; 'folder:/data/flowers/' -> 'flowers'."""
  if dataset.startswith(dataset_names.FOLDER_PREFIX):
    return os.path.basename(os.path.normpath(dataset[len(dataset_names.FOLDER_PREFIX) :]))
  return dataset.replace('/', '_')


@functools.cache
def _pre_logits_fn(model: nn.Module) -> Callable[[Any, np.ndarray], jax.Array]:
  return jax.jit(
      lambda variables, images: features.extract(model, variables, images, blocks=0).pre_logits
  )


def _split(model: nn.Module, variables: Any, data: data_settings.DataSettings, split: str) -> Split:
  """Every example of `split` of `data.dataset`, preprocessed as in evaluation."""
  outputs, labels = [], []
  for batch in input_pipeline.eval_iterator(data, split=split, process_index=0, process_count=1):
    real = batch['mask'] > 0
    outputs.append(np.asarray(_pre_logits_fn(model)(variables, batch['image']), np.float32)[real])
    labels.append(batch['label'][real])
  return Split(np.concatenate(outputs), np.concatenate(labels))


def dataset(
    model: nn.Module,
    variables: Any,
    data: data_settings.DataSettings,
    name: str,
    *,
    train_split: str,
    test_split: str,
) -> Dataset:
  """The frozen features of dataset `name`, its images preprocessed as the run `data`
  evaluates."""
  data = dataclasses.replace(data, dataset=name, train_split=train_split, eval_split=test_split)
  info = input_pipeline.get_dataset_info(data)
  return Dataset(
      metric_name(name),
      info.num_classes,
      _split(model, variables, data, train_split),
      _split(model, variables, data, test_split),
  )


@dataclasses.dataclass(frozen=True)
class Evaluator(evaluator_settings.FrozenFeaturesSettings, evaluator.Named, abc.ABC):
  """An `evaluator.Evaluator` of frozen features: a subclass defines `evaluate`, which `run`
  feeds every dataset."""

  @abc.abstractmethod
  def evaluate(self, data: Dataset) -> dict[str, float]:
    """The metrics of one dataset's frozen features."""

  def run(self, subject: evaluator.Subject) -> dict[str, float]:
    splits = {'train_split': self.train_split, 'test_split': self.test_split}
    metrics = {}
    for name in self.datasets:
      metrics.update(
          self.evaluate(dataset(subject.model, subject.variables, subject.data, name, **splits))
      )
    return metrics
