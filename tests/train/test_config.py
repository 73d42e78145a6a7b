"""The config key ``allocator``: read, validated, not compared when a run is resumed, and ``trim``'s
release of free memory after every training step."""

import pytest

from kmipgt.malloc import ALLOCATORS, OPT_OUT_VARIABLE
from kmipgt.train import load_config
from kmipgt.train.config import config_differences, config_to_dict
from kmipgt.train.validation import validate_config


def test_allocator_defaults_to_retain_and_reads_every_policy():
    assert load_config().allocator == "retain"
    assert [load_config(None, [f"allocator={policy}"]).allocator for policy in ALLOCATORS] == list(ALLOCATORS)
    for policy in ALLOCATORS:
        validate_config(load_config(None, [f"allocator={policy}"]))


def test_an_unknown_allocator_is_a_validation_error_naming_the_key():
    with pytest.raises(ValueError, match=r"config key 'allocator' must be one of .*got 'jemalloc'"):
        validate_config(load_config(None, ["allocator=jemalloc"]))
    with pytest.raises(TypeError, match="'allocator'"):
        load_config(None, ["allocator=1"])


def test_a_run_resumes_under_another_allocator():
    # Memory and speed change, results do not; a run saved before the key existed counts as `retain`.
    saved = config_to_dict(load_config(None, ["model.attention.k=8"]))
    del saved["allocator"]
    def current(k: int) -> dict:
        return config_to_dict(load_config(None, [f"model.attention.k={k}", "allocator=live"]))

    assert config_differences(saved, current(8)) == []
    assert config_differences(saved, current(4)) == ["model.attention.k"]


@pytest.mark.parametrize(
    ("policy", "opt_out", "releases"), [("trim", "", 3), ("retain", "", 0), ("trim", "1", 0)]
)
def test_trim_gives_free_memory_back_after_every_training_step(
    tmp_path, monkeypatch, policy, opt_out, releases
):
    # KMIPGT_SYSTEM_MALLOC wins over the key for trim's release too, as the docs say.
    from kmipgt.train import Trainer
    from tiny_runs import toy_node_config, toy_node_data

    calls = []
    monkeypatch.setenv(OPT_OUT_VARIABLE, opt_out)
    monkeypatch.setattr("kmipgt.train.datasets.load_raw", lambda config: toy_node_data().graph)
    monkeypatch.setattr("kmipgt.train.stepper.release_free_memory", lambda: calls.append("released") or True)
    config = toy_node_config(tmp_path, epochs=3)
    config.allocator = policy
    Trainer(config).fit(progress=False)
    assert len(calls) == releases  # one full-batch step per epoch
