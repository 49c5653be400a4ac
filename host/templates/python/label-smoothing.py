"""{{name}}: a label-smoothing policy for lsgd-host. Edit INFO, Config and epsilon; the host
calls describe once, configure once, then epsilon every step. lsgd_kit.py has the
describe/configure helpers.
{{#stateful}}

It keeps state between calls: the best metric seen so far, which lowers epsilon as the metric
rises, and which the host saves with snapshot and brings back with restore.
{{/stateful}}
"""

import struct

import lsgd_kit as kit
from componentize_py_types import Err
from wit_world import exports

INFO = kit.info(
    "{{name}}",
    "0.1.0",
{{^stateful}}
    "A constant label-smoothing epsilon",
{{/stateful}}
{{#stateful}}
    "epsilon x (1 - the best metric so far)",
{{/stateful}}
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
{{#stateful}}
        # The state: the best metric (test accuracy) seen so far, 0 before the first. It changes
        # in the policy calls, starts afresh with new parameters (a new Config), and travels as
        # its 8 bytes (a little-endian f64) through snapshot and restore.
        self.best = 0.0
{{/stateful}}


# The exported Plugin class (describe, configure) and the current Config.
Plugin, config = kit.plugin(INFO, Config)


class LabelSmoothing(exports.LabelSmoothing):
    def epsilon(self, s):
{{^stateful}}
        return config().epsilon
{{/stateful}}
{{#stateful}}
        c = config()
        # Taking the larger value twice changes nothing: the host may call again at one step.
        if s.last_metric is not None and s.last_metric > c.best:
            c.best = s.last_metric
{{/stateful}}
{{#stateful}}
        # Computed in f64 and rounded to f32 once, as in every language.
        return f32(c.epsilon * (1.0 - c.best))
{{/stateful}}
{{#stateful}}


class State(exports.State):
    def snapshot(self):
        return struct.pack("<d", config().best)

    def restore(self, snapshot):
        (config().best,) = struct.unpack("<d", kit.check_snapshot(snapshot, 8))
{{/stateful}}
