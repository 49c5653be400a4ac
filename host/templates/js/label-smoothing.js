// {{name}}: a label-smoothing policy for lsgd-host. Edit INFO, configure and epsilon; the host
// calls describe once, configure once, then epsilon every step. lsgd_kit.js has the
// describe/configure helpers; a thrown string becomes configure's error.
{{#stateful}}
//
// It keeps state between calls: the best metric seen so far, which lowers epsilon as the metric
// rises, and which the host saves with snapshot and brings back with restore.
{{/stateful}}
import * as kit from "./lsgd_kit.js";

const INFO = {
  name: "{{name}}",
  version: "0.1.0",
{{^stateful}}
  summary: "A constant label-smoothing epsilon",
{{/stateful}}
{{#stateful}}
  summary: "epsilon x (1 - the best metric so far)",
{{/stateful}}
  params: [kit.floatParam("epsilon", 0.1, "label-smoothing epsilon, in [0, 1)")],
};

{{#stateful}}
// `best` is the state: the best metric (test accuracy) seen so far, 0 before the first. It
// changes in the policy calls, starts afresh with new parameters, and travels as its 8 bytes (a
// little-endian f64) through snapshot and restore.
{{/stateful}}
function configure(p) {
  const e = p.epsilon;
  // Checked after the f32 conversion the contract requires: 0.999999999 rounds to 1.
  if (!(e >= 0.0 && Math.fround(e) < 1.0)) throw `epsilon must be in [0, 1), got ${kit.fmt(e)}`;
  return { epsilon: Math.fround(e){{#stateful}}, best: 0.0{{/stateful}} };
}

// A fresh instance (the host makes one after any fault) starts from the defaults.
let cfg = configure(kit.resolve(INFO, []));

export const plugin = {
  describe: () => INFO,
  configure(params) {
    cfg = configure(kit.resolve(INFO, params));
  },
};

export const labelSmoothing = {
{{^stateful}}
  epsilon: (s) => cfg.epsilon,
{{/stateful}}
{{#stateful}}
  epsilon(s) {
    // Taking the larger value twice changes nothing: the host may call again at one step.
    if (s.lastMetric != null && s.lastMetric > cfg.best) cfg.best = s.lastMetric;
    // Computed in f64 and rounded to f32 once, as in every language.
    return Math.fround(cfg.epsilon * (1.0 - cfg.best));
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
