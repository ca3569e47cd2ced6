"""Kernels and programs as Python callables: argument checking, specialization, execution."""
