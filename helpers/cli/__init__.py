"""The ``workshop`` command: one module per group of subcommands. The top floor: imports anything, and
nothing imports it.
"""
