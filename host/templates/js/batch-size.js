// {{name}}: a batch-size controller for lsgd-host. Edit INFO, configure and globalBatch; the
// host calls describe once, configure once, then globalBatch every step. lsgd_kit.js has the
// describe/configure helpers; a thrown string becomes configure's error.
{{#stateful}}
//
// It keeps state between calls: the best metric seen so far, which doubles the batch once it
// reaches 0.5, and which the host saves with snapshot and brings back with restore.
{{/stateful}}
import * as kit from "./lsgd_kit.js";

const INFO = {
  name: "{{name}}",
  version: "0.1.0",
{{^stateful}}
  summary: "A constant global batch: the configured one x factor",
{{/stateful}}
{{#stateful}}
  summary: "The configured global batch x factor, doubled once the best metric reaches 0.5",
{{/stateful}}
  params: [kit.integerParam("factor", 1, "multiplier on the configured global batch (>= 1)")],
};

{{^stateful}}
const configure = (p) => ({ factor: kit.u32AtLeast(p, "factor", 1) });
{{/stateful}}
{{#stateful}}
// `best` is the state: the best metric (test accuracy) seen so far, 0 before the first. It
// changes in the policy calls, starts afresh with new parameters, and travels as its 8 bytes (a
// little-endian f64) through snapshot and restore.
const configure = (p) => ({ factor: kit.u32AtLeast(p, "factor", 1), best: 0.0 });
{{/stateful}}

// A fresh instance (the host makes one after any fault) starts from the defaults.
let cfg = configure(kit.resolve(INFO, []));

export const plugin = {
  describe: () => INFO,
  configure(params) {
    cfg = configure(kit.resolve(INFO, params));
  },
};

export const batchSize = {
{{^stateful}}
  // A multiple of the configured batch stays divisible by the world size.
  globalBatch: (s) => Math.min(s.globalBatch * cfg.factor, 0xffffffff),
{{/stateful}}
{{#stateful}}
  globalBatch(s) {
    // Taking the larger value twice changes nothing: the host may call again at one step.
    if (s.lastMetric != null && s.lastMetric > cfg.best) cfg.best = s.lastMetric;
    // A multiple of the configured batch stays divisible by the world size.
    return Math.min(s.globalBatch * cfg.factor * (cfg.best >= 0.5 ? 2 : 1), 0xffffffff);
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
