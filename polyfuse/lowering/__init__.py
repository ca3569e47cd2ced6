"""Passes that rewrite IR toward code: specialization, graph passes, fusion, memory plans."""
