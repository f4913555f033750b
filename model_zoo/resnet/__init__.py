"""ResNet model zoo entry: ResNet-18/34/50/101/152 with the ms_boost training recipes.

Entry points: ``train.py``, ``eval.py``, ``export.py`` and ``main_job.py`` (the quick start); the
building blocks live in :mod:`model_zoo.resnet.src`.
"""
