"""``python -m biasviz.cli``: the same as the ``biasviz`` command."""

from biasviz.cli import main

main()
