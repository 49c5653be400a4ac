// {{name}}: a learning-rate schedule for lsgd-host. Edit INFO, configure, learningRate and
// momentum; the host calls describe once, configure once, then learningRate and momentum every
// step. lsgd_kit.js has the describe/configure helpers; a thrown string becomes configure's error.
{{#stateful}}
//
// It keeps state between calls: the best metric seen so far, which lowers the rate as the metric
// rises, and which the host saves with snapshot and brings back with restore.
{{/stateful}}
import * as kit from "./lsgd_kit.js";

const INFO = {
  name: "{{name}}",
  version: "0.1.0",
{{^stateful}}
  summary: "A constant learning rate: base_lr x B/B_ref x scale",
{{/stateful}}
{{#stateful}}
  summary: "base_lr x B/B_ref x scale x (1 - the best metric so far)",
{{/stateful}}
  params: [kit.floatParam("scale", 1.0, "multiplier on the linearly scaled learning rate (>= 0)")],
};

{{^stateful}}
const configure = (p) => ({ scale: kit.floatAtLeast(p, "scale", 0.0) });
{{/stateful}}
{{#stateful}}
// `best` is the state: the best metric (test accuracy) seen so far, 0 before the first. It
// changes in the policy calls, starts afresh with new parameters, and travels as its 8 bytes (a
// little-endian f64) through snapshot and restore.
const configure = (p) => ({ scale: kit.floatAtLeast(p, "scale", 0.0), best: 0.0 });
{{/stateful}}

// A fresh instance (the host makes one after any fault) starts from the defaults.
let cfg = configure(kit.resolve(INFO, []));

export const plugin = {
  describe: () => INFO,
  configure(params) {
    cfg = configure(kit.resolve(INFO, params));
  },
};

export const schedule = kit.schedule({
  learningRate(s) {
{{#stateful}}
    // Taking the larger value twice changes nothing: the host may call again at one step.
    if (s.lastMetric != null && s.lastMetric > cfg.best) cfg.best = s.lastMetric;
{{/stateful}}
    const ratio = s.referenceBatch === 0 ? 1.0 : s.globalBatch / s.referenceBatch;
    return s.baseLr * ratio * cfg.scale{{#stateful}} * (1.0 - cfg.best){{/stateful}};
  },
  // The momentum of the step, asked right after learningRate with the same state: a number in
  // [0, 1) sets SGD's momentum (AdamW's beta1) for the step, e.g. `return 0.9;`; null keeps the
  // configured one (--momentum, --adam-beta1), as does leaving momentum out.
  momentum(s) {
    return null;
  },
});
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
