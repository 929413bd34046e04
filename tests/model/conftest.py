"""Checks marked ``slow`` run only when asked for (``make test-slow`` = ``pytest -m slow``)."""

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with `make test-slow`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
