"""{{name}}: a label-smoothing policy for lsgd-host. Edit INFO, Config and epsilon; the host
calls describe once, configure once, then epsilon every step. lsgd_kit.py has the
describe/configure helpers."""

import struct

import lsgd_kit as kit
from componentize_py_types import Err
from wit_world import exports

INFO = kit.info(
    "{{name}}",
    "0.1.0",
    "A constant label-smoothing epsilon",
    [kit.float_("epsilon", 0.1, "label-smoothing epsilon, in [0, 1)")],
)


def f32(v):
    """v rounded to the nearest f32, the type the contract returns."""
    return struct.unpack("f", struct.pack("f", v))[0]


class Config:
    def __init__(self, p):
        e = p["epsilon"]
        # Checked after the f32 conversion: 0.999999999 rounds to 1.
        if not (0.0 <= e < 1.0 and f32(e) < 1.0):
            raise Err(f"epsilon must be in [0, 1), got {kit.fmt(e)}")
        self.epsilon = f32(e)


# The exported Plugin class (describe, configure) and the current Config.
Plugin, config = kit.plugin(INFO, Config)


class LabelSmoothing(exports.LabelSmoothing):
    def epsilon(self, s):
        return config().epsilon
