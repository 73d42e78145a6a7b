"""Every shipped config and sweep cell builds the same model as the code that wrote the stored fingerprints:
the same parameter and buffer names and shapes, the same initial values and the same forward, bit for bit."""

import json

import pytest

from model_fingerprints import STORE, compact, fingerprints


@pytest.fixture(scope="module")
def stored():
    return json.loads(STORE.read_text())


@pytest.fixture(scope="module")
def current():
    return compact(fingerprints())


def test_every_shipped_config_and_sweep_cell_is_fingerprinted(stored, current):
    assert sorted(current["models"]) == sorted(stored["models"])


def test_models_keep_their_state_names_shapes_and_values(stored, current):
    changed = {}
    for name, entry in current["models"].items():
        old = stored["models"][name]
        if entry["state"] != old["state"]:
            now, before = current["layouts"][entry["state"]], stored["layouts"][old["state"]]
            changed[name] = {"added": [s for s in now if s not in before][:5],
                             "removed": [s for s in before if s not in now][:5]}
        elif entry["values_sha256"] != old["values_sha256"]:
            changed[name] = "initial values differ"
    assert not changed, f"{len(changed)} models changed, e.g. {dict(list(changed.items())[:3])}"


def test_models_compute_the_same_forward(stored, current):
    changed = {
        name: (stored["models"][name]["forward_sum"], entry["forward_sum"])
        for name, entry in current["models"].items()
        if entry["forward_sha256"] != stored["models"][name]["forward_sha256"]
    }
    example = dict(list(changed.items())[:3])
    assert not changed, f"{len(changed)} forwards changed (stored sum, current sum), e.g. {example}"
