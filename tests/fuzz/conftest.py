import pytest


def pytest_collection_modifyitems(config, items):
    """The long fuzz runs (marked ``slow``) run only when ``-m`` selects them."""
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="a long fuzz run: select it with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
