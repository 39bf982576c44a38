"""Training our GPT-2 variants (``biasviz train``) and the checkpoint folders a run writes.

:mod:`.loop` is the training loop (one process or DDP under torchrun); :mod:`.checkpoints` names and checks
the run directory and its ``checkpoint-STEP`` folders, which checkpoint sweeps read back; :mod:`.series` reads
the step (and tokens) from any checkpoint series' names and picks the checkpoints a sweep takes.
"""
