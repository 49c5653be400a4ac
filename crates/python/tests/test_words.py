"""lsgd-torch's messages name what a Python user changes: the class that takes the plugin
(`WasmLR`), the keyword arguments (`global_batch=250`, `fuel=`, `deadline_ms=`, `memory_mb=`,
`max_batch=`), never the host's flags; and parameter values come as Python, numpy and torch
give them (an integral float for an integer, a numpy scalar, a 0-d tensor)."""

import numpy as np
import pytest
import torch

from lsgd_torch import CodecState, PluginFault, WasmBatchSize, WasmLR

SHAPE = dict(epochs=2, steps_per_epoch=10, global_batch=256)


def optimizer():
    return torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)


def no_flags(message):
    """The message, asserted to name no command-line flag."""
    assert " --" not in message and "(--" not in message, message
    return message


def test_a_plugin_of_the_wrong_kind_names_the_class_that_takes_it():
    with pytest.raises(ValueError) as e:
        WasmLR(optimizer(), "codec-top-k", **SHAPE)
    assert "is a codec plugin (world codec-plugin), but WasmLR takes a schedule plugin " \
        "(world schedule-plugin)" in no_flags(str(e.value))
    with pytest.raises(ValueError) as e:
        CodecState(None, "warmup")
    assert "is a schedule plugin (world schedule-plugin), but CodecState takes a codec " \
        "plugin (world codec-plugin)" in no_flags(str(e.value))


def test_a_bad_run_shape_names_the_keyword_and_its_value():
    with pytest.raises(ValueError) as e:
        WasmLR(optimizer(), "warmup", epochs=2, steps_per_epoch=10, global_batch=250,
               world_size=4)
    assert no_flags(str(e.value)) == \
        "global_batch=250 must be a positive multiple of the world size 4"
    with pytest.raises(ValueError) as e:
        WasmLR(optimizer(), "warmup", **SHAPE, reference_batch=0)
    assert str(e.value) == "reference_batch must be at least 1"


def test_a_call_out_of_fuel_says_to_raise_fuel():
    with pytest.raises(PluginFault) as e:
        WasmLR(optimizer(), "bad-schedule", params={"mode": "loop"}, **SHAPE, fuel=100_000)
    assert "ran out of its 100000-unit fuel budget (deterministic: every rank stops here; " \
        "raise it with the fuel= argument)" in no_flags(str(e.value))


def test_a_call_past_its_deadline_says_to_raise_deadline_ms():
    with pytest.raises(PluginFault) as e:
        WasmLR(optimizer(), "bad-schedule", params={"mode": "sleeping"}, **SHAPE,
               fuel=1 << 60, deadline_ms=20)
    assert "exceeded its 20 ms wall-clock deadline (a backstop; raise it with the " \
        "deadline_ms= argument)" in no_flags(str(e.value))


def test_a_plugin_over_its_memory_cap_says_to_raise_memory_mb():
    with pytest.raises(PluginFault) as e:
        WasmLR(optimizer(), "bad-schedule", params={"mode": "grow"}, **SHAPE, memory_mb=4)
    assert "MiB, over the 4 MiB cap (raise it with the memory_mb= argument)" \
        in no_flags(str(e.value))


def test_a_batch_over_max_batch_names_the_keyword():
    batch = WasmBatchSize("batch-ramp", epochs=90, steps_per_epoch=10, global_batch=8192,
                          world_size=32, max_batch=4096)
    with pytest.raises(PluginFault) as e:
        batch.global_batch
    assert "must be between 1 and max_batch=4096" in no_flags(str(e.value))


def test_a_plugin_found_nowhere_says_what_to_do_in_python_terms():
    with pytest.raises(FileNotFoundError) as e:
        WasmLR(optimizer(), "no-such-plugin", **SHAPE)
    assert no_flags(str(e.value)).endswith(
        "(give the plugin's path, or add the folder that holds it to LSGD_PLUGIN_PATH)"
    )


def identity(**params):
    return WasmLR(optimizer(), "linear", params=params, **SHAPE).policy.identity


def test_an_integral_float_is_the_integer_a_plugin_declares_with_the_same_identity():
    four = identity(total_iters=4)
    assert '("total_iters", "4")' in four
    for same in [4.0, np.int64(4), np.float64(4.0), np.float32(4.0), torch.tensor(4),
                 torch.tensor(4.0)]:
        assert identity(total_iters=same) == four, repr(same)
    with pytest.raises(ValueError) as e:
        identity(total_iters=4.5)
    assert "parameter `total_iters` expects an integer, got `4.5`" in str(e.value)
    with pytest.raises(ValueError) as e:
        identity(total_iters=2.0**53)
    assert "expects an integer" in str(e.value)


def test_numpy_and_torch_values_are_the_numbers_they_hold():
    assert identity(start_factor=np.float64(0.25)) == identity(start_factor=0.25)
    # A float32 0.1 is the float it holds, not the decimal it prints as.
    assert identity(start_factor=np.float32(0.1)) == identity(start_factor=float(np.float32(0.1)))
    assert identity(start_factor=torch.tensor(0.5, dtype=torch.float64)) == \
        identity(start_factor=0.5)
    ms = WasmLR(optimizer(), "multistep", params={"milestones": np.array([3, 6])}, **SHAPE)
    assert ms.policy.identity == \
        WasmLR(optimizer(), "multistep", params={"milestones": [3, 6]}, **SHAPE).policy.identity
    with pytest.raises(TypeError, match="at most one dimension"):
        identity(start_factor=np.zeros((2, 2)))
