"""A run from token windows to a file: the model's bias and weights captured, reduced or stored.

:mod:`.run` is one process; :mod:`.distributed` splits samples across torchrun ranks; :mod:`.sweep` goes over a
training run's checkpoints; :mod:`.api` is ``biasviz.extract`` for any model or path; :mod:`.tokens` picks the
tokenizer.
"""
