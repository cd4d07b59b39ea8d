from __future__ import annotations

import pytest

from tests.runner.support import compose_config


@pytest.fixture
def cfg_of():
    return compose_config
