"""{{name}}: a learning-rate schedule for lsgd-host. Edit INFO, Config, learning_rate and
momentum; the host calls describe once, configure once, then learning_rate and momentum every
step. lsgd_kit.py has the describe/configure helpers.
{{#stateful}}

It keeps state between calls: the best metric seen so far, which lowers the rate as the metric
rises, and which the host saves with snapshot and brings back with restore.
{{/stateful}}
"""
{{#stateful}}

import struct
{{/stateful}}

import lsgd_kit as kit
{{#stateful}}
from wit_world import exports
{{/stateful}}

INFO = kit.info(
    "{{name}}",
    "0.1.0",
{{^stateful}}
    "A constant learning rate: base_lr x B/B_ref x scale",
{{/stateful}}
{{#stateful}}
    "base_lr x B/B_ref x scale x (1 - the best metric so far)",
{{/stateful}}
    [kit.float_("scale", 1.0, "multiplier on the linearly scaled learning rate (>= 0)")],
)


class Config:
    def __init__(self, p):
        self.scale = kit.float_at_least(p, "scale", 0.0)
{{#stateful}}
        # The state: the best metric (test accuracy) seen so far, 0 before the first. It changes
        # in the policy calls, starts afresh with new parameters (a new Config), and travels as
        # its 8 bytes (a little-endian f64) through snapshot and restore.
        self.best = 0.0
{{/stateful}}


# The exported Plugin class (describe, configure) and the current Config.
Plugin, config = kit.plugin(INFO, Config)


class Schedule(kit.Schedule):
    def learning_rate(self, s):
{{#stateful}}
        c = config()
        # Taking the larger value twice changes nothing: the host may call again at one step.
        if s.last_metric is not None and s.last_metric > c.best:
            c.best = s.last_metric
{{/stateful}}
        ratio = 1.0 if s.reference_batch == 0 else float(s.global_batch) / float(s.reference_batch)
        return s.base_lr * ratio * config().scale{{#stateful}} * (1.0 - c.best){{/stateful}}

    def momentum(self, s):
        # The momentum of the step, asked right after learning_rate with the same state: a value
        # in [0, 1) sets SGD's momentum (AdamW's beta1) for the step, e.g. `return 0.9`; None
        # keeps the configured one (--momentum, --adam-beta1), as does leaving momentum out.
        return None
{{#stateful}}


class State(exports.State):
    def snapshot(self):
        return struct.pack("<d", config().best)

    def restore(self, snapshot):
        (config().best,) = struct.unpack("<d", kit.check_snapshot(snapshot, 8))
{{/stateful}}
