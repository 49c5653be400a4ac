// {{name}}: a layer-wise rate policy for lsgd-host. Edit INFO, configure and multipliers; the
// host calls describe once, configure once, then multipliers every step with the norms of every
// parameter tensor, and scales the step's learning rate for tensor i by the i-th multiplier (one
// per tensor, each finite and >= 0). lsgd_kit.js has the describe/configure helpers; a thrown
// string becomes configure's error.
//
// This one is LARS (You et al., 2017): a weight's multiplier is its trust ratio
// coefficient x ||w|| / (||g|| + weight_decay x ||w||); biases, BatchNorm parameters and tensors
// with a zero norm keep the schedule's rate (multiplier 1).
{{#stateful}}
//
// It keeps state between calls: the best metric seen so far, which lowers the coefficient to
// coefficient x (1 - best) as the metric rises, and which the host saves with snapshot and brings
// back with restore.
{{/stateful}}
import * as kit from "./lsgd_kit.js";

const INFO = {
  name: "{{name}}",
  version: "0.1.0",
{{^stateful}}
  summary: "LARS: coefficient x ||w|| / (||g|| + wd x ||w||) per weight, 1 elsewhere",
{{/stateful}}
{{#stateful}}
  summary: "LARS with the coefficient x (1 - the best metric so far) per weight, 1 elsewhere",
{{/stateful}}
  params: [kit.floatParam("coefficient", 0.001, "LARS trust coefficient (>= 0)")],
};

{{^stateful}}
const configure = (p) => ({ coefficient: kit.floatAtLeast(p, "coefficient", 0.0) });
{{/stateful}}
{{#stateful}}
// `best` is the state: the best metric (test accuracy) seen so far, 0 before the first. It
// changes in the policy calls, starts afresh with new parameters, and travels as its 8 bytes (a
// little-endian f64) through snapshot and restore.
const configure = (p) => ({
  coefficient: kit.floatAtLeast(p, "coefficient", 0.0),
  best: 0.0,
});
{{/stateful}}

// A fresh instance (the host makes one after any fault) starts from the defaults.
let cfg = configure(kit.resolve(INFO, []));

export const plugin = {
  describe: () => INFO,
  configure(params) {
    cfg = configure(kit.resolve(INFO, params));
  },
};

// LARS's local learning rate of one tensor: finite and >= 0 for any finite norms. A role
// arrives as its WIT name: "weight", "bias" or "batchnorm".
function trustRatio(coefficient, t) {
  const w = t.weightNorm, g = t.gradNorm;
  if (t.role !== "weight" || !(w > 0.0 && g > 0.0)) return 1.0;
  return (coefficient * w) / (g + t.weightDecay * w);
}

export const layerRate = {
{{^stateful}}
  // Exactly one multiplier per tensor, in the order of `tensors`.
  multipliers: (s, tensors) => tensors.map((t) => trustRatio(cfg.coefficient, t)),
{{/stateful}}
{{#stateful}}
  multipliers(s, tensors) {
    // Taking the larger value twice changes nothing: the host may call again at one step.
    if (s.lastMetric != null && s.lastMetric > cfg.best) cfg.best = s.lastMetric;
    // Exactly one multiplier per tensor, in the order of `tensors`.
    const coefficient = cfg.coefficient * (1.0 - cfg.best);
    return tensors.map((t) => trustRatio(coefficient, t));
  },
{{/stateful}}
};
{{#stateful}}

export const state = {
  snapshot() {
    const bytes = new Uint8Array(8);
    new DataView(bytes.buffer).setFloat64(0, cfg.best, true);
    return bytes;
  },
  restore(snapshot) {
    cfg.best = new DataView(kit.checkSnapshot(snapshot, 8).buffer).getFloat64(0, true);
  },
};
{{/stateful}}
