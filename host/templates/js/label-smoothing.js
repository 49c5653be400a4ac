// {{name}}: a label-smoothing policy for lsgd-host. Edit INFO, configure and epsilon; the host
// calls describe once, configure once, then epsilon every step. lsgd_kit.js has the
// describe/configure helpers; a thrown string becomes configure's error.
import * as kit from "./lsgd_kit.js";

const INFO = {
  name: "{{name}}",
  version: "0.1.0",
  summary: "A constant label-smoothing epsilon",
  params: [kit.floatParam("epsilon", 0.1, "label-smoothing epsilon, in [0, 1)")],
};

function configure(p) {
  const e = p.epsilon;
  // Checked after the f32 conversion the contract requires: 0.999999999 rounds to 1.
  if (!(e >= 0.0 && Math.fround(e) < 1.0)) throw `epsilon must be in [0, 1), got ${kit.fmt(e)}`;
  return { epsilon: Math.fround(e) };
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
  epsilon: (s) => cfg.epsilon,
};
