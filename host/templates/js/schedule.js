// {{name}}: a learning-rate schedule for lsgd-host. Edit INFO, configure and learningRate; the
// host calls describe once, configure once, then learningRate every step. lsgd_kit.js has the
// describe/configure helpers; a thrown string becomes configure's error.
import * as kit from "./lsgd_kit.js";

const INFO = {
  name: "{{name}}",
  version: "0.1.0",
  summary: "A constant learning rate: base_lr x B/B_ref x scale",
  params: [kit.floatParam("scale", 1.0, "multiplier on the linearly scaled learning rate (>= 0)")],
};

const configure = (p) => ({ scale: kit.floatAtLeast(p, "scale", 0.0) });

// A fresh instance (the host makes one after any fault) starts from the defaults.
let cfg = configure(kit.resolve(INFO, []));

export const plugin = {
  describe: () => INFO,
  configure(params) {
    cfg = configure(kit.resolve(INFO, params));
  },
};

export const schedule = {
  learningRate(s) {
    const ratio = s.referenceBatch === 0 ? 1.0 : s.globalBatch / s.referenceBatch;
    return s.baseLr * ratio * cfg.scale;
  },
};
