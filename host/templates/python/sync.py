"""{{name}}: a synchronisation policy for lsgd-host. Edit INFO, Config, plan and outer_step; the
host calls describe once, configure once, then plan before every step, and outer_step after each
step that plan made an average, with the drift of every parameter tensor over the window.
lsgd_kit.py has the describe/configure helpers.

This one is local SGD (Lin et al. 2018; Federated Averaging with every client): each rank takes
`period` steps on its own shard, the last of which ends the window (AVERAGE), and the outer step
is plain averaging, which makes the agreed weights the ranks' mean.
{{#stateful}}

It keeps state between calls: the best metric seen so far, which doubles the period once it
reaches 0.5, and which the host saves with snapshot and brings back with restore.
{{/stateful}}
"""
{{#stateful}}

import struct
{{/stateful}}

import lsgd_kit as kit
from wit_world import exports
from wit_world.exports.sync import OuterUpdate, StepKind

INFO = kit.info(
    "{{name}}",
    "0.1.0",
{{^stateful}}
    "Local SGD: average the ranks' weights every period steps",
{{/stateful}}
{{#stateful}}
    "Local SGD: average every period steps, twice as long once the best metric reaches 0.5",
{{/stateful}}
    [
        kit.integer(
            "period", 8, "steps per window; the ranks average at a window's last step (>= 1)"
        )
    ],
)


class Config:
    def __init__(self, p):
        self.period = kit.u32_at_least(p, "period", 1)
{{#stateful}}
        # The state: the best metric (test accuracy) seen so far, 0 before the first. It changes
        # in the policy calls, starts afresh with new parameters (a new Config), and travels as
        # its 8 bytes (a little-endian f64) through snapshot and restore.
        self.best = 0.0
{{/stateful}}


# The exported Plugin class (describe, configure) and the current Config.
Plugin, config = kit.plugin(INFO, Config)


class Sync(exports.Sync):
    def plan(self, s, w):
        """How step s.step moves: LOCAL (each rank on its own), AVERAGE (a local step that ends
        the window) or SYNCHRONOUS (the gradients summed over the ranks, as without a sync
        policy; only at a window's start, w.local_steps == 0). Every rank must decide alike:
        only s, w and the plugin's state may count."""
{{#stateful}}
        c = config()
        # Taking the larger value twice changes nothing: the host may call again at one step.
        if s.last_metric is not None and s.last_metric > c.best:
            c.best = s.last_metric
{{/stateful}}
        period = config().period{{#stateful}} * (2 if c.best >= 0.5 else 1){{/stateful}}
        # w.local_steps local steps are behind this one in the window.
        return StepKind.AVERAGE if w.local_steps >= period - 1 else StepKind.LOCAL

    def outer_step(self, s, w, tensors):
        """The outer step on delta, the pseudo-gradient theta_global - theta_k averaged over the
        ranks: m = momentum x m + delta; d = delta + momentum x m with nesterov, else m;
        theta_global -= lr x lr_scale[i] x d. Plain averaging is lr 1 and no momentum; DiLoCo's
        outer Nesterov step would be lr 0.7, momentum 0.9, nesterov True. lr_scale is empty (1
        for every tensor) or one multiplier per tensor, in the order of `tensors`, whose norms
        (weight_norm, delta_norm, rank_delta_norm ...) describe the window's drift."""
        return OuterUpdate(lr=1.0, momentum=0.0, nesterov=False, lr_scale=[])
{{#stateful}}


class State(exports.State):
    def snapshot(self):
        return struct.pack("<d", config().best)

    def restore(self, snapshot):
        (config().best,) = struct.unpack("<d", kit.check_snapshot(snapshot, 8))
{{/stateful}}
