// {{name}}: a synchronisation policy for lsgd-host. Edit INFO, configure, plan and outerStep;
// the host calls describe once, configure once, then plan before every step, and outerStep after
// each step that plan made an "average", with the drift of every parameter tensor over the
// window. lsgd_kit.js has the describe/configure helpers; a thrown string becomes configure's
// error.
//
// This one is local SGD (Lin et al. 2018; Federated Averaging with every client): each rank
// takes `period` steps on its own shard, the last of which ends the window ("average"), and the
// outer step is plain averaging, which makes the agreed weights the ranks' mean.
{{#stateful}}
//
// It keeps state between calls: the best metric seen so far, which doubles the period once it
// reaches 0.5, and which the host saves with snapshot and brings back with restore.
{{/stateful}}
import * as kit from "./lsgd_kit.js";

const INFO = {
  name: "{{name}}",
  version: "0.1.0",
{{^stateful}}
  summary: "Local SGD: average the ranks' weights every period steps",
{{/stateful}}
{{#stateful}}
  summary: "Local SGD: average every period steps, twice as long once the best metric reaches 0.5",
{{/stateful}}
  params: [
    kit.integerParam(
      "period", 8, "steps per window; the ranks average at a window's last step (>= 1)"),
  ],
};

{{^stateful}}
const configure = (p) => ({ period: kit.u32AtLeast(p, "period", 1) });
{{/stateful}}
{{#stateful}}
// `best` is the state: the best metric (test accuracy) seen so far, 0 before the first. It
// changes in the policy calls, starts afresh with new parameters, and travels as its 8 bytes (a
// little-endian f64) through snapshot and restore.
const configure = (p) => ({ period: kit.u32AtLeast(p, "period", 1), best: 0.0 });
{{/stateful}}

// A fresh instance (the host makes one after any fault) starts from the defaults.
let cfg = configure(kit.resolve(INFO, []));

export const plugin = {
  describe: () => INFO,
  configure(params) {
    cfg = configure(kit.resolve(INFO, params));
  },
};

export const sync = {
  // How step s.step moves, as its WIT name: "local" (each rank on its own), "average" (a local
  // step that ends the window) or "synchronous" (the gradients summed over the ranks, as without
  // a sync policy; only at a window's start, w.localSteps === 0). Every rank must decide alike:
  // only s, w and the plugin's state may count.
  plan(s, w) {
{{#stateful}}
    // Taking the larger value twice changes nothing: the host may call again at one step.
    if (s.lastMetric != null && s.lastMetric > cfg.best) cfg.best = s.lastMetric;
{{/stateful}}
    const period = cfg.period{{#stateful}} * (cfg.best >= 0.5 ? 2 : 1){{/stateful}};
    // w.localSteps local steps are behind this one in the window.
    return w.localSteps >= period - 1 ? "average" : "local";
  },
  // The outer step on delta, the pseudo-gradient theta_global - theta_k averaged over the ranks:
  // m = momentum x m + delta; d = delta + momentum x m with nesterov, else m;
  // theta_global -= lr x lrScale[i] x d. Plain averaging is lr 1 and no momentum; DiLoCo's outer
  // Nesterov step would be lr 0.7, momentum 0.9, nesterov true. lrScale is empty (1 for every
  // tensor) or one multiplier per tensor, in the order of `tensors`, whose norms (weightNorm,
  // deltaNorm, rankDeltaNorm ...) describe the window's drift.
  outerStep: (s, w, tensors) => ({ lr: 1.0, momentum: 0.0, nesterov: false, lrScale: [] }),
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
