"""{{name}}: a layer-wise rate policy for lsgd-host. Edit INFO, Config and multipliers; the host
calls describe once, configure once, then multipliers every step with the norms of every
parameter tensor, and scales the step's learning rate for tensor i by the i-th multiplier (one
per tensor, each finite and >= 0). lsgd_kit.py has the describe/configure helpers.

This one is LARS (You et al., 2017): a weight's multiplier is its trust ratio
coefficient x ||w|| / (||g|| + weight_decay x ||w||); biases, BatchNorm parameters and tensors
with a zero norm keep the schedule's rate (multiplier 1).
{{#stateful}}

It keeps state between calls: the best metric seen so far, which lowers the coefficient to
coefficient x (1 - best) as the metric rises, and which the host saves with snapshot and brings
back with restore.
{{/stateful}}
"""
{{#stateful}}

import struct
{{/stateful}}

import lsgd_kit as kit
from wit_world import exports
from wit_world.exports.layer_rate import Role

INFO = kit.info(
    "{{name}}",
    "0.1.0",
{{^stateful}}
    "LARS: coefficient x ||w|| / (||g|| + wd x ||w||) per weight, 1 elsewhere",
{{/stateful}}
{{#stateful}}
    "LARS with the coefficient x (1 - the best metric so far) per weight, 1 elsewhere",
{{/stateful}}
    [kit.float_("coefficient", 0.001, "LARS trust coefficient (>= 0)")],
)


class Config:
    def __init__(self, p):
        self.coefficient = kit.float_at_least(p, "coefficient", 0.0)
{{#stateful}}
        # The state: the best metric (test accuracy) seen so far, 0 before the first. It changes
        # in the policy calls, starts afresh with new parameters (a new Config), and travels as
        # its 8 bytes (a little-endian f64) through snapshot and restore.
        self.best = 0.0
{{/stateful}}


# The exported Plugin class (describe, configure) and the current Config.
Plugin, config = kit.plugin(INFO, Config)


def trust_ratio(coefficient, t):
    """LARS's local learning rate of one tensor: finite and >= 0 for any finite norms."""
    w, g = t.weight_norm, t.grad_norm
    if t.role != Role.WEIGHT or not (w > 0.0 and g > 0.0):
        return 1.0
    return coefficient * w / (g + t.weight_decay * w)


class LayerRate(exports.LayerRate):
    def multipliers(self, s, tensors):
{{#stateful}}
        c = config()
        # Taking the larger value twice changes nothing: the host may call again at one step.
        if s.last_metric is not None and s.last_metric > c.best:
            c.best = s.last_metric
{{/stateful}}
        # Exactly one multiplier per tensor, in the order of `tensors`.
        coefficient = config().coefficient{{#stateful}} * (1.0 - c.best){{/stateful}}
        return [trust_ratio(coefficient, t) for t in tensors]
{{#stateful}}


class State(exports.State):
    def snapshot(self):
        return struct.pack("<d", config().best)

    def restore(self, snapshot):
        (config().best,) = struct.unpack("<d", kit.check_snapshot(snapshot, 8))
{{/stateful}}
