"""Registers the marker of tests that load the real SmolLM2 model (opt-in, see the test)."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "real_model: loads the real SmolLM2-135M (opt-in: FMMETA_REAL_MODEL_TESTS=1)"
    )
