"""label-smoothing in Python: Szegedy et al.'s label smoothing (used by Mikami et al.), constant
or ramped linearly between two epochs, as plugins/lsgd-policy/src/label_smoothing.rs does it."""

import math
import struct

import lsgd_kit as kit
from componentize_py_types import Err
from wit_world import exports

INFO = kit.info(
    "label-smoothing",
    "1.0.0",
    "Label-smoothing epsilon, constant or ramped linearly between two epochs",
    [
        kit.float_("epsilon", 0.1, "epsilon at the start, in [0, 1)"),
        kit.float_(
            "final_epsilon",
            -1.0,
            "epsilon at the end of the ramp, in [0, 1); negative = same as epsilon",
        ),
        kit.float_("ramp_start_epoch", 0.0, "epoch where the ramp begins"),
        kit.float_("ramp_end_epoch", 0.0, "epoch where the ramp ends; 0 = total epochs"),
    ],
)


def f32(v: float) -> float:
    """v rounded to the nearest f32, as Rust's `v as f32`."""
    return struct.unpack("f", struct.pack("f", v))[0]


def epsilon_param(p, name):
    """An epsilon in [0, 1) that stays below 1 after the f32 conversion the contract requires."""
    v = p[name]
    if math.isfinite(v) and 0.0 <= v < 1.0 and f32(v) < 1.0:
        return v
    raise Err(f"{name} must be in [0, 1), got {kit.fmt(v)}")


class Config:
    def __init__(self, p):
        self.epsilon = epsilon_param(p, "epsilon")
        # A negative default stands in for "none", which a WIT float default cannot express.
        self.final = self.epsilon if p["final_epsilon"] < 0.0 else epsilon_param(p, "final_epsilon")
        self.start = kit.float_at_least(p, "ramp_start_epoch", 0.0)
        self.end = kit.float_at_least(p, "ramp_end_epoch", 0.0)
        if self.end > 0.0 and self.end < self.start:
            raise Err(
                f"ramp_end_epoch must be >= ramp_start_epoch ({kit.fmt(self.start)}), "
                f"got {kit.fmt(self.end)}"
            )


Plugin, config = kit.plugin(INFO, Config)


class LabelSmoothing(exports.LabelSmoothing):
    def epsilon(self, s):
        c, e = config(), s.epoch_fraction
        end = float(s.total_epochs) if c.end == 0.0 else c.end
        if e <= c.start:
            eps = c.epsilon
        elif e >= end:
            eps = c.final
        else:
            v = c.epsilon + (c.final - c.epsilon) * (e - c.start) / (end - c.start)
            # Rounding must not step outside the two endpoints, which are known to be valid.
            eps = min(max(v, min(c.epsilon, c.final)), max(c.epsilon, c.final))
        return f32(eps)
