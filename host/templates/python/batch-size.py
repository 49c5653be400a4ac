"""{{name}}: a batch-size controller for lsgd-host. Edit INFO, Config and global_batch; the
host calls describe once, configure once, then global_batch every step. lsgd_kit.py has the
describe/configure helpers."""

import lsgd_kit as kit
from wit_world import exports

INFO = kit.info(
    "{{name}}",
    "0.1.0",
    "A constant global batch: the configured one x factor",
    [kit.integer("factor", 1, "multiplier on the configured global batch (>= 1)")],
)


class Config:
    def __init__(self, p):
        self.factor = kit.u32_at_least(p, "factor", 1)


# The exported Plugin class (describe, configure) and the current Config.
Plugin, config = kit.plugin(INFO, Config)


class BatchSize(exports.BatchSize):
    def global_batch(self, s):
        # A multiple of the configured batch stays divisible by the world size.
        return min(s.global_batch * config().factor, 0xFFFFFFFF)
