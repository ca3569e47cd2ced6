"""Compilation targets: the Target type and the backend registry."""

from polyfuse.targets.backends import BACKENDS, Backend, Codegen, Device
from polyfuse.targets.target import Target

__all__ = ["BACKENDS", "Backend", "Codegen", "Device", "Target"]
