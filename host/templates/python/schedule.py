"""{{name}}: a learning-rate schedule for lsgd-host. Edit INFO, Config and learning_rate; the
host calls describe once, configure once, then learning_rate every step. lsgd_kit.py has the
describe/configure helpers."""

import lsgd_kit as kit
from wit_world import exports

INFO = kit.info(
    "{{name}}",
    "0.1.0",
    "A constant learning rate: base_lr x B/B_ref x scale",
    [kit.float_("scale", 1.0, "multiplier on the linearly scaled learning rate (>= 0)")],
)


class Config:
    def __init__(self, p):
        self.scale = kit.float_at_least(p, "scale", 0.0)


# The exported Plugin class (describe, configure) and the current Config.
Plugin, config = kit.plugin(INFO, Config)


class Schedule(exports.Schedule):
    def learning_rate(self, s):
        ratio = 1.0 if s.reference_batch == 0 else float(s.global_batch) / float(s.reference_batch)
        return s.base_lr * ratio * config().scale
