/* warmup in C: Goyal et al.'s schedule (linear scaling, gradual warmup, step decay), the same
 * arithmetic as plugins/lsgd-policy/src/warmup.rs and lr.rs in the same order, so that
 * `lsgd-host compare warmup warmup-c.wasm` finds it bit-identical. */
#include "lsgd_kit.h"

enum scaling { LINEAR, SQRT, NO_SCALING };
enum shape { GRADUAL, CONSTANT, NO_WARMUP };

static struct {
  enum scaling scaling;
  enum shape shape;
  double warmup_epochs, gamma;
  double milestones[64];
  size_t n_milestones;
} cfg = {LINEAR, GRADUAL, 5.0, 0.1, {30.0, 60.0, 80.0}, 3};

static const char *const SCALINGS[] = {"linear", "sqrt", "none"};
static const char *const SHAPES[] = {"gradual", "constant", "none"};
static const double MILESTONES[] = {30.0, 60.0, 80.0};

void exports_lsgd_policy_plugin_describe(exports_lsgd_policy_plugin_plugin_info_t *ret) {
  lsgd_spec_t specs[] = {
      lsgd_spec_choice("scaling", SCALINGS, 3,
                       "target LR from base_lr: linear (x B/B_ref), sqrt (x sqrt(B/B_ref)) or none"),
      lsgd_spec_choice("warmup", SHAPES, 3,
                       "warmup shape: gradual (eta/k rising to eta), constant (eta/k) or none"),
      lsgd_spec_float("warmup_epochs", 5.0, "warmup length W in epochs"),
      lsgd_spec_float_list("milestones", MILESTONES, 3,
                           "epochs at which the LR is multiplied by gamma (ascending)"),
      lsgd_spec_float("gamma", 0.1, "decay factor applied at each milestone"),
  };
  lsgd_info(ret, "warmup", "1.0.0",
            "Goyal et al.: LR scaling, gradual warmup, then step decay at milestones", specs, 5);
}

static int word_index(const lsgd_string_t *s, const char *const *words) {
  for (int i = 0; i < 3; i++)
    if (lsgd_str_eq(s, words[i])) return i;
  return -1;
}

/* The checks of Warmup::configure, in its order. */
static bool apply(const lsgd_params_t *p, lsgd_string_t *err) {
  const lsgd_string_t *shape = lsgd_text(p, "warmup");
  int sh = word_index(shape, SHAPES);
  if (sh < 0)
    return lsgd_fail(err, "warmup must be gradual, constant or none, got '%.*s'", (int)shape->len,
                     shape->ptr);
  double epochs;
  if (!lsgd_float_at_least(p, "warmup_epochs", 0.0, &epochs, err)) return false;
  const lsgd_string_t *scaling = lsgd_text(p, "scaling");
  int sc = word_index(scaling, SCALINGS);
  if (sc < 0)
    return lsgd_fail(err, "scaling must be linear, sqrt or none, got '%.*s'", (int)scaling->len,
                     scaling->ptr);
  double milestones[64], gamma;
  size_t n;
  if (!lsgd_milestones(p, "milestones", milestones, &n, err)) return false;
  if (!lsgd_float_at_least(p, "gamma", 0.0, &gamma, err)) return false;
  cfg.scaling = (enum scaling)sc;
  cfg.shape = (enum shape)sh;
  cfg.warmup_epochs = cfg.shape == NO_WARMUP ? 0.0 : epochs;
  cfg.gamma = gamma;
  memcpy(cfg.milestones, milestones, n * sizeof(double));
  cfg.n_milestones = n;
  return true;
}

bool exports_lsgd_policy_plugin_configure(exports_lsgd_policy_plugin_list_param_t *params,
                                          lsgd_string_t *err) {
  exports_lsgd_policy_plugin_plugin_info_t info;
  exports_lsgd_policy_plugin_describe(&info);
  lsgd_params_t p;
  bool ok = lsgd_resolve(&info, params, &p, err) && apply(&p, err);
  exports_lsgd_policy_plugin_plugin_info_free(&info);
  exports_lsgd_policy_plugin_list_param_free(params);
  return ok;
}

double exports_lsgd_policy_schedule_learning_rate(exports_lsgd_policy_schedule_train_state_t *s) {
  double r = s->reference_batch == 0 ? 1.0 : (double)s->global_batch / (double)s->reference_batch;
  double eta = cfg.scaling == LINEAR ? s->base_lr * r
               : cfg.scaling == SQRT ? s->base_lr * sqrt(r)
                                     : s->base_lr;
  double e = s->epoch_fraction, w = cfg.warmup_epochs;
  if (e < w && cfg.shape != NO_WARMUP) {
    double k = r > 1.0 ? r : 1.0;
    if (cfg.shape == GRADUAL) return eta * (1.0 / k) * (1.0 + (k - 1.0) * e / w);
    return eta / k;
  }
  /* Repeated multiplication, not pow(): pow's rounding differs between libms. */
  double lr = eta;
  for (size_t i = lsgd_passed(cfg.milestones, cfg.n_milestones, e); i > 0; i--) lr *= cfg.gamma;
  return lr;
}
