"""Shared fixtures of the bundle tests: the small valid bundle (a few KB) as bytes."""

import pytest

from .kdtr_corpus import RawBundle, small_bundle


@pytest.fixture(scope="session")
def small_raw(tmp_path_factory) -> bytes:
    return small_bundle(tmp_path_factory.mktemp("kdtr"))


@pytest.fixture
def raw(small_raw) -> RawBundle:
    """A fresh decoded copy of the small bundle to mutate."""
    return RawBundle.decode(small_raw)
