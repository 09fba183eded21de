# Copied from facebookresearch/deit at commit 7e160fe43f0252d17191b71cbb5826254114ea5b: augment.py
# (DeiT III's 3-Augment: `GaussianBlur`, `Solarization`, `gray_scale`, `new_data_aug_generator`)
# and the binary cross-entropy of engine.py / main.py (`--bce-loss`), the official code our
# DeiT III pieces are tested against. Changes: torchvision is imported through
# `vit_jax.benchmarks.timm_reference` (PyPI's torchvision is a CUDA build beside a CPU-only torch); the
# unused imports and the `horizontal_flip` class dropped; `new_data_aug_generator` takes its three
# arguments instead of `args` and returns its crop (primary) and 3-Augment (secondary) parts
# separately, without the final ToTensor/Normalize; the loss lines of `train_one_epoch` and
# main.py's criterion are gathered in `bce_loss`. Everything that computes is unchanged.
#
# Copyright (c) Meta Platforms, Inc. and affiliates. All rights reserved.
# Licensed under the Apache License, Version 2.0 (deit's LICENSE file).

import random

from PIL import ImageFilter, ImageOps

from vit_jax.benchmarks import timm_reference

timm_reference.import_timm()

import torch
from torchvision import transforms
from timm.data.transforms import RandomResizedCropAndInterpolation


class GaussianBlur(object):
    """
    Apply Gaussian Blur to the PIL image.
    """
    def __init__(self, p=0.1, radius_min=0.1, radius_max=2.):
        self.prob = p
        self.radius_min = radius_min
        self.radius_max = radius_max

    def __call__(self, img):
        do_it = random.random() <= self.prob
        if not do_it:
            return img

        img = img.filter(
            ImageFilter.GaussianBlur(
                radius=random.uniform(self.radius_min, self.radius_max)
            )
        )
        return img

class Solarization(object):
    """
    Apply Solarization to the PIL image.
    """
    def __init__(self, p=0.2):
        self.p = p

    def __call__(self, img):
        if random.random() < self.p:
            return ImageOps.solarize(img)
        else:
            return img

class gray_scale(object):
    """
    Apply Solarization to the PIL image.
    """
    def __init__(self, p=0.2):
        self.p = p
        self.transf = transforms.Grayscale(3)

    def __call__(self, img):
        if random.random() < self.p:
            return self.transf(img)
        else:
            return img


def new_data_aug_generator(img_size, src, color_jitter):
    remove_random_resized_crop = src
    primary_tfl = []
    scale=(0.08, 1.0)
    interpolation='bicubic'
    if remove_random_resized_crop:
        primary_tfl = [
            transforms.Resize(img_size, interpolation=3),
            transforms.RandomCrop(img_size, padding=4,padding_mode='reflect'),
            transforms.RandomHorizontalFlip()
        ]
    else:
        primary_tfl = [
            RandomResizedCropAndInterpolation(
                img_size, scale=scale, interpolation=interpolation),
            transforms.RandomHorizontalFlip()
        ]


    secondary_tfl = [transforms.RandomChoice([gray_scale(p=1.0),
                                              Solarization(p=1.0),
                                              GaussianBlur(p=1.0)])]

    if color_jitter is not None and not color_jitter==0:
        secondary_tfl.append(transforms.ColorJitter(color_jitter, color_jitter, color_jitter))
    return transforms.Compose(primary_tfl), transforms.Compose(secondary_tfl)


def bce_loss(outputs, targets):
    # engine.py train_one_epoch, after mixup_fn: `if args.bce_loss: targets = targets.gt(0.0)...`;
    # main.py: `if args.bce_loss: criterion = torch.nn.BCEWithLogitsLoss()`.
    targets = targets.gt(0.0).type(targets.dtype)
    criterion = torch.nn.BCEWithLogitsLoss()
    return criterion(outputs, targets)
