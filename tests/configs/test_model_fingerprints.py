"""Every shipped config and sweep cell builds the same model as the code that wrote the stored fingerprints:
the same parameter and buffer names and shapes, the same initial values and the same forward, within a
tolerance that another CPU's rounding cannot cross and that a changed initialisation, layer or order of
operations always does (both sides tested here)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kmipgt.train.config import load_config
from model_fingerprints import (
    STORE,
    build,
    expanded,
    fingerprint,
    fingerprint_model,
    fingerprints,
    forward_differs,
    resolved_configs,
    state_differences,
)

# Models that take every code path whose rounding depends on the CPU: k-MIP search and softmax, full
# attention, the Performer's orthogonal features (a QR), batch and layer norms, PyG baselines, every task
# level.
SAMPLE = ["peptides_func", "minnesota", "minnesota_link", "synthetic_rooms",
          "sweeps/city_attention_kinds/model.attention=performer__seed=0",
          "sweeps/city_attention_kinds/model.attention=full__seed=0",
          "sweeps/minnesota_baselines/model.kind=sgformer__seed=0"]


@pytest.fixture(scope="module")
def configs():
    return resolved_configs()


@pytest.fixture(scope="module")
def stored():
    return expanded(json.loads(STORE.read_text()))


@pytest.fixture(scope="module")
def current(configs):
    return fingerprints(configs)


def _changed_states(stored, current) -> dict:
    changed = {}
    for name, entry in current.items():
        old = stored[name]
        if entry["layout"] != old["layout"]:
            changed[name] = {"added": [s for s in entry["layout"] if s not in old["layout"]][:5],
                             "removed": [s for s in old["layout"] if s not in entry["layout"]][:5]}
        elif differ := state_differences(old["state"], entry["state"]):
            changed[name] = f"initial values differ: {[entry['layout'][i][0] for i in differ[:5]]}"
    return changed


def test_every_shipped_config_and_sweep_cell_is_fingerprinted(stored, current):
    assert sorted(current) == sorted(stored)


def test_models_keep_their_state_names_shapes_and_values(stored, current):
    changed = _changed_states(stored, current)
    assert not changed, f"{len(changed)} models changed, e.g. {dict(list(changed.items())[:3])}"


def test_models_compute_the_same_forward(stored, current):
    changed = [name for name, entry in current.items() if forward_differs(stored[name]["forward"],
                                                                          entry["forward"])]
    assert not changed, f"{len(changed)} forwards changed, e.g. {changed[:3]}"


def test_the_sample_takes_every_attention_kind(configs):
    kinds = {configs[name].model.attention.kind for name in SAMPLE}
    assert {"kmip", "performer", "full"} <= kinds
    assert {configs[name].model.kind for name in SAMPLE} >= {"gps", "sgformer"}
    assert {configs[name].task.level for name in SAMPLE} == {"node", "edge", "graph"}


def test_fingerprints_hold_under_other_cpu_code_paths(stored, tmp_path):
    """The sample fingerprinted with torch's generic (non-vectorised) kernels and MKL limited to SSE4.2,
    as on a CPU without AVX2 or AVX-512, stays within tolerance of the stored prints."""
    script = (
        "import json, sys\n"
        "from model_fingerprints import fingerprints, resolved_configs\n"
        "configs = resolved_configs()\n"
        "json.dump(fingerprints({n: configs[n] for n in sys.argv[2:]}), open(sys.argv[1], 'w'))\n"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
           "ONEDNN_MAX_CPU_ISA": "SSE41", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = tmp_path / "prints.json"
    subprocess.run([sys.executable, "-c", script, str(out), *SAMPLE], env=env, check=True,
                   cwd=Path(__file__).parents[1], capture_output=True)
    other = json.loads(out.read_text())
    assert not _changed_states(stored, other)
    assert not [name for name in SAMPLE if forward_differs(stored[name]["forward"], other[name]["forward"])]


def test_an_ulp_of_every_initial_value_passes(configs):
    """Another CPU's rounding of the initial values: every float32 value moved by up to two ulps."""
    for name in SAMPLE:
        model, inputs = build(configs[name])
        before = fingerprint_model(model, inputs)
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for value in model.state_dict().values():
                if value.is_floating_point():
                    ulps = torch.randint(-2, 3, value.shape, generator=generator).float()
                    value.add_(ulps * torch.finfo(value.dtype).eps / 2 * value.abs())
        after = fingerprint_model(model, inputs)
        assert not state_differences(before["state"], after["state"]), name
        assert not forward_differs(before["forward"], after["forward"]), name


@pytest.mark.parametrize("change", ["scaled", "redrawn", "xavier"])
def test_a_changed_initialisation_is_caught(configs, change):
    model, inputs = build(configs["peptides_func"])
    before = fingerprint_model(model, inputs)
    layer = model.layers[0].attention.lin_out
    with torch.no_grad():
        if change == "scaled":
            layer.weight.mul_(1.001)
        elif change == "redrawn":
            torch.manual_seed(5)
            layer.reset_parameters()
        else:
            torch.nn.init.xavier_uniform_(layer.weight)
    after = fingerprint_model(model, inputs)
    names = [before["layout"][i][0] for i in state_differences(before["state"], after["state"])]
    changed = {"weight"} if change != "redrawn" else {"weight", "bias"}
    assert names == [f"layers.0.attention.lin_out.{name}" for name in ("weight", "bias") if name in changed]
    assert forward_differs(before["forward"], after["forward"])


def test_a_new_layer_is_caught(configs):
    config = configs["peptides_func"]
    model, inputs = build(config)
    deeper = load_config("peptides_func", [f"model.num_layers={config.model.num_layers + 1}"])
    assert fingerprint(deeper)["layout"] != fingerprint_model(model, inputs)["layout"]


def test_a_reordered_operation_is_caught(configs):
    """The same parameters applied in another order (attention after the local branch instead of beside
    it) give the same state and another forward."""
    config = configs["peptides_func"]
    reordered = load_config("peptides_func", ["model.attention.order=series"])
    assert reordered != config
    before, after = fingerprint(config), fingerprint(reordered)
    assert before["layout"] == after["layout"]
    assert not state_differences(before["state"], after["state"])
    assert forward_differs(before["forward"], after["forward"])
