// warmup in JavaScript: Goyal et al.'s schedule (linear scaling, gradual warmup, step decay).
//
// The arithmetic is plugins/lsgd-policy/src/warmup.rs and lr.rs in the same order (JS numbers
// are IEEE doubles), so `lsgd-host compare warmup warmup-js.wasm` finds it bit-identical.
import * as kit from "../lsgd-plugin-build/kit/js/lsgd_kit.js";

const INFO = {
  name: "warmup",
  version: "1.0.0",
  summary: "Goyal et al.: LR scaling, gradual warmup, then step decay at milestones",
  params: [
    kit.choiceParam("scaling", ["linear", "sqrt", "none"],
      "target LR from base_lr: linear (x B/B_ref), sqrt (x sqrt(B/B_ref)) or none"),
    kit.choiceParam("warmup", ["gradual", "constant", "none"],
      "warmup shape: gradual (eta/k rising to eta), constant (eta/k) or none"),
    kit.floatParam("warmup_epochs", 5.0, "warmup length W in epochs"),
    kit.floatListParam("milestones", [30.0, 60.0, 80.0],
      "epochs at which the LR is multiplied by gamma (ascending)"),
    kit.floatParam("gamma", 0.1, "decay factor applied at each milestone"),
  ],
};

// The checks of Warmup::configure, in its order.
function configure(p) {
  const shape = p.warmup;
  if (!["gradual", "constant", "none"].includes(shape)) {
    throw `warmup must be gradual, constant or none, got '${shape}'`;
  }
  const epochs = kit.floatAtLeast(p, "warmup_epochs", 0.0);
  const scaling = p.scaling;
  if (!["linear", "sqrt", "none"].includes(scaling)) {
    throw `scaling must be linear, sqrt or none, got '${scaling}'`;
  }
  return {
    shape,
    scaling,
    epochs: shape === "none" ? 0.0 : epochs,
    milestones: kit.milestones(p, "milestones"),
    gamma: kit.floatAtLeast(p, "gamma", 0.0),
  };
}

let cfg = configure(kit.resolve(INFO, []));

export const plugin = {
  describe() {
    return INFO;
  },
  configure(params) {
    cfg = configure(kit.resolve(INFO, params));
  },
};

export const schedule = {
  learningRate(s) {
    const r = s.referenceBatch === 0 ? 1.0 : s.globalBatch / s.referenceBatch;
    const eta = cfg.scaling === "linear" ? s.baseLr * r
      : cfg.scaling === "sqrt" ? s.baseLr * Math.sqrt(r)
      : s.baseLr;
    const e = s.epochFraction, w = cfg.epochs;
    if (e < w && cfg.shape !== "none") {
      const k = r > 1.0 ? r : 1.0;
      if (cfg.shape === "gradual") return eta * (1.0 / k) * (1.0 + (k - 1.0) * e / w);
      return eta / k;
    }
    // Repeated multiplication, not Math.pow: pow's rounding differs between engines.
    let lr = eta;
    for (let i = kit.passed(cfg.milestones, e); i > 0; i--) lr *= cfg.gamma;
    return lr;
  },
};
