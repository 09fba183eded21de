"""Datasets that vit_jax provides itself; everything else comes from TFDS by name.

Their names are declared here, where reading them imports nothing (the config schema checks them
when a config file is loaded): `DIGITS` (the embedded scikit-learn digits, `digits.py`) and
`FOLDER_PREFIX` (your own images, 'folder:/path/to/images', `folder.py`).
"""

DIGITS = 'digits'
FOLDER_PREFIX = 'folder:'
