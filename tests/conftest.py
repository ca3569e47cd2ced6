import os

from hypothesis import settings

# CI runs the same examples every time; developers' runs explore new ones.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")
