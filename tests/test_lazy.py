"""``module:attribute`` references: imported on use, anything else passed through."""

import json

import pytest

from kmipgt.lazy import resolve


def test_a_reference_names_the_object_it_imports():
    assert resolve("json:dumps") is json.dumps
    assert resolve(json.dumps) is json.dumps


@pytest.mark.parametrize("text", ["json.dumps", ":dumps", "json:"])
def test_a_malformed_reference_is_a_value_error(text):
    with pytest.raises(ValueError, match=r"'package\.module:attribute' reference"):
        resolve(text)


def test_a_lazy_package_imports_a_name_with_its_module_and_lists_it():
    import kmipgt.nn

    assert "GPSLayer" in dir(kmipgt.nn)
    assert kmipgt.nn.GPSLayer is resolve("kmipgt.nn.gps_layer:GPSLayer")
    with pytest.raises(AttributeError, match=r"module 'kmipgt\.nn' has no attribute 'GPSLayr'"):
        kmipgt.nn.GPSLayr  # noqa: B018


def test_a_public_name_keeps_its_meaning_when_a_submodule_of_that_name_is_imported():
    import kmipgt.data
    from kmipgt.data import minnesota
    from kmipgt.data.minnesota import MINNESOTA_FEATURES  # binds the submodule on its package

    assert callable(minnesota) and minnesota.__module__ == "kmipgt.data.minnesota"
    assert kmipgt.data.MINNESOTA_FEATURES is MINNESOTA_FEATURES
