"""Autotuning of scheduling options: space, search, builder, runner, database."""
