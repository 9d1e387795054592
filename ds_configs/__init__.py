"""DeepSpeed JSON configs, shipped with the package as ``fmmeta.ds_configs`` (see setup.py).

A package only so that an installed fmmeta can find them (:mod:`fmmeta.shipped`).
"""
