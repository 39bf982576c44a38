"""``python -m biasviz``: the command line (what ``torchrun -m biasviz`` runs in each process)."""

from biasviz.cli import main

if __name__ == "__main__":
    main()
