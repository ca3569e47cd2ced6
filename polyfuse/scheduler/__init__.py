"""Polyhedral scheduling with isl (the only package that imports islpy)."""
