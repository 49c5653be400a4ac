"""warmup in Python: Goyal et al.'s schedule (linear scaling, gradual warmup, step decay).

The arithmetic is plugins/lsgd-policy/src/warmup.rs and lr.rs in the same order (Python floats
are IEEE doubles), so `lsgd-host compare warmup warmup-python.wasm` finds it bit-identical.
"""

import math

import lsgd_kit as kit
from componentize_py_types import Err
from wit_world import exports

INFO = kit.info(
    "warmup",
    "1.0.0",
    "Goyal et al.: LR scaling, gradual warmup, then step decay at milestones",
    [
        kit.choice(
            "scaling",
            ["linear", "sqrt", "none"],
            "target LR from base_lr: linear (x B/B_ref), sqrt (x sqrt(B/B_ref)) or none",
        ),
        kit.choice(
            "warmup",
            ["gradual", "constant", "none"],
            "warmup shape: gradual (eta/k rising to eta), constant (eta/k) or none",
        ),
        kit.float_("warmup_epochs", 5.0, "warmup length W in epochs"),
        kit.float_list(
            "milestones",
            [30.0, 60.0, 80.0],
            "epochs at which the LR is multiplied by gamma (ascending)",
        ),
        kit.float_("gamma", 0.1, "decay factor applied at each milestone"),
    ],
)


class Config:
    """The checks of Warmup::configure, in its order."""

    def __init__(self, p):
        self.shape = p["warmup"]
        if self.shape not in ("gradual", "constant", "none"):
            raise Err(f"warmup must be gradual, constant or none, got '{self.shape}'")
        epochs = kit.float_at_least(p, "warmup_epochs", 0.0)
        self.epochs = 0.0 if self.shape == "none" else epochs
        self.scaling = p["scaling"]
        if self.scaling not in ("linear", "sqrt", "none"):
            raise Err(f"scaling must be linear, sqrt or none, got '{self.scaling}'")
        self.milestones = kit.milestones(p, "milestones")
        self.gamma = kit.float_at_least(p, "gamma", 0.0)


Plugin, config = kit.plugin(INFO, Config)


class Schedule(exports.Schedule):
    def learning_rate(self, s):
        c = config()
        r = 1.0 if s.reference_batch == 0 else float(s.global_batch) / float(s.reference_batch)
        if c.scaling == "linear":
            eta = s.base_lr * r
        elif c.scaling == "sqrt":
            eta = s.base_lr * math.sqrt(r)
        else:
            eta = s.base_lr
        e, w = s.epoch_fraction, c.epochs
        if e < w and c.shape != "none":
            k = r if r > 1.0 else 1.0
            if c.shape == "gradual":
                return eta * (1.0 / k) * (1.0 + (k - 1.0) * e / w)
            return eta / k
        # Repeated multiplication, not pow: pow's rounding differs between languages.
        lr = eta
        for _ in range(kit.passed(c.milestones, e)):
            lr *= c.gamma
        return lr
