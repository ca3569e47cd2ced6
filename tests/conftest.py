import os

from hypothesis import settings

# CI runs the same examples every time; developers' runs explore new ones.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

# Kernels compiled by the tests go to a fresh cache, not the user's.
if "POLYFUSE_CACHE_DIR" not in os.environ:
    import tempfile
    os.environ["POLYFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="polyfuse-test-cache-")
