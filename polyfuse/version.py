"""polyfuse's version (here, not in ``polyfuse/__init__.py``, so that the layers that
record it, the disk cache and tuning records, need not import the whole package)."""

__version__ = "0.1.0"
