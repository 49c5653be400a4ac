// {{name}}: a batch-size controller for lsgd-host. Edit INFO, configure and globalBatch; the
// host calls describe once, configure once, then globalBatch every step. lsgd_kit.js has the
// describe/configure helpers; a thrown string becomes configure's error.
import * as kit from "./lsgd_kit.js";

const INFO = {
  name: "{{name}}",
  version: "0.1.0",
  summary: "A constant global batch: the configured one x factor",
  params: [kit.integerParam("factor", 1, "multiplier on the configured global batch (>= 1)")],
};

const configure = (p) => ({ factor: kit.u32AtLeast(p, "factor", 1) });

// A fresh instance (the host makes one after any fault) starts from the defaults.
let cfg = configure(kit.resolve(INFO, []));

export const plugin = {
  describe: () => INFO,
  configure(params) {
    cfg = configure(kit.resolve(INFO, params));
  },
};

export const batchSize = {
  // A multiple of the configured batch stays divisible by the world size.
  globalBatch: (s) => Math.min(s.globalBatch * cfg.factor, 0xffffffff),
};
