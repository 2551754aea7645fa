"""The installation's namespace: set once from the config, and the one place a shadow is trusted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpushare import installation, keys, rules
from gpushare.config import load_config
from gpushare.errors import ConfigError

SHADOW = {keys.LABEL_ROLE: keys.ROLE_SHADOW}


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    yield
    installation.use_namespace(keys.DEFAULT_NAMESPACE)


def test_a_shadow_is_trusted_only_in_the_installations_namespace() -> None:
    assert rules.is_shadow(keys.DEFAULT_NAMESPACE, SHADOW)
    installation.use_namespace("gpu-platform")
    assert rules.is_shadow("gpu-platform", SHADOW)
    assert not rules.is_shadow(keys.DEFAULT_NAMESPACE, SHADOW)


@pytest.mark.parametrize("name", ["", "Upper", "a_b", "-a", "a-", "x" * 64, "a.b"])
def test_a_name_no_namespace_can_have_is_refused_and_nothing_changes(name: str) -> None:
    with pytest.raises(ValueError, match="not a namespace name"):
        installation.use_namespace(name)
    assert installation.namespace() == keys.DEFAULT_NAMESPACE


def test_the_config_names_the_namespace_and_refuses_a_bad_one() -> None:
    assert load_config(text="version: v1\nnamespace: gpu-platform\n").namespace == "gpu-platform"
    assert load_config(text="version: v1\n").namespace == keys.DEFAULT_NAMESPACE
    with pytest.raises(ConfigError, match="namespace"):
        load_config(text="version: v1\nnamespace: Not_OK\n")
