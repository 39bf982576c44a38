"""Helpers every stage uses: errors, atomic files, input and output checks, devices, memory, processes."""
