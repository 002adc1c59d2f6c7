"""Fixtures of the DDTree tests."""

import pytest


@pytest.fixture(params=["tiny", "tiny2"])
def preset_name(request):
    return request.param
