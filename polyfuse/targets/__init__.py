"""Compilation targets."""

from polyfuse.targets.target import Target

__all__ = ["Target"]
