"""{{name}}: a batch-size controller for lsgd-host. Edit INFO, Config and global_batch; the
host calls describe once, configure once, then global_batch every step. lsgd_kit.py has the
describe/configure helpers.
{{#stateful}}

It keeps state between calls: the best metric seen so far, which doubles the batch once it
reaches 0.5, and which the host saves with snapshot and brings back with restore.
{{/stateful}}
"""
{{#stateful}}

import struct
{{/stateful}}

import lsgd_kit as kit
from wit_world import exports

INFO = kit.info(
    "{{name}}",
    "0.1.0",
{{^stateful}}
    "A constant global batch: the configured one x factor",
{{/stateful}}
{{#stateful}}
    "The configured global batch x factor, doubled once the best metric reaches 0.5",
{{/stateful}}
    [kit.integer("factor", 1, "multiplier on the configured global batch (>= 1)")],
)


class Config:
    def __init__(self, p):
        self.factor = kit.u32_at_least(p, "factor", 1)
{{#stateful}}
        # The state: the best metric (test accuracy) seen so far, 0 before the first. It changes
        # in the policy calls, starts afresh with new parameters (a new Config), and travels as
        # its 8 bytes (a little-endian f64) through snapshot and restore.
        self.best = 0.0
{{/stateful}}


# The exported Plugin class (describe, configure) and the current Config.
Plugin, config = kit.plugin(INFO, Config)


class BatchSize(exports.BatchSize):
    def global_batch(self, s):
{{#stateful}}
        c = config()
        # Taking the larger value twice changes nothing: the host may call again at one step.
        if s.last_metric is not None and s.last_metric > c.best:
            c.best = s.last_metric
{{/stateful}}
        # A multiple of the configured batch stays divisible by the world size.
        b = s.global_batch * config().factor{{#stateful}} * (2 if c.best >= 0.5 else 1){{/stateful}}
        return min(b, 0xFFFFFFFF)
{{#stateful}}


class State(exports.State):
    def snapshot(self):
        return struct.pack("<d", config().best)

    def restore(self, snapshot):
        (config().best,) = struct.unpack("<d", kit.check_snapshot(snapshot, 8))
{{/stateful}}
