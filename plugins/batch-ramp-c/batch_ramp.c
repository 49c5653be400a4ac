/* batch-ramp in C: grow the global batch at milestones instead of decaying the learning rate
 * (Smith et al.; Mikami et al.), as plugins/lsgd-policy/src/batch_ramp.rs does it. */
#include "lsgd_kit.h"

static struct {
  uint32_t factor, max_batch;
  double milestones[64];
  size_t n_milestones;
} cfg = {2, 0, {30.0, 60.0, 80.0}, 3};

static const double MILESTONES[] = {30.0, 60.0, 80.0};

void exports_lsgd_policy_plugin_describe(exports_lsgd_policy_plugin_plugin_info_t *ret) {
  lsgd_spec_t specs[] = {
      lsgd_spec_integer("factor", 2, "batch multiplier at each milestone (>= 1)"),
      lsgd_spec_float_list("milestones", MILESTONES, 3,
                           "epochs at which the batch grows (ascending)"),
      lsgd_spec_integer("max_batch", 0, "largest global batch; 0 = no cap"),
  };
  lsgd_info(ret, "batch-ramp", "1.0.0",
            "Batch-size control: multiply the global batch by factor at each milestone epoch",
            specs, 3);
}

bool exports_lsgd_policy_plugin_configure(exports_lsgd_policy_plugin_list_param_t *params,
                                          lsgd_string_t *err) {
  exports_lsgd_policy_plugin_plugin_info_t info;
  exports_lsgd_policy_plugin_describe(&info);
  lsgd_params_t p;
  uint32_t factor, max_batch;
  double milestones[64];
  size_t n;
  bool ok = lsgd_resolve(&info, params, &p, err) &&
            lsgd_u32_at_least(&p, "factor", 1, &factor, err) &&
            lsgd_milestones(&p, "milestones", milestones, &n, err) &&
            lsgd_u32_at_least(&p, "max_batch", 0, &max_batch, err);
  if (ok) {
    cfg.factor = factor;
    cfg.max_batch = max_batch;
    memcpy(cfg.milestones, milestones, n * sizeof(double));
    cfg.n_milestones = n;
  }
  exports_lsgd_policy_plugin_plugin_info_free(&info);
  exports_lsgd_policy_plugin_list_param_free(params);
  return ok;
}

uint32_t exports_lsgd_policy_batch_size_global_batch(
    exports_lsgd_policy_batch_size_train_state_t *s) {
  uint32_t b = s->global_batch;
  for (size_t i = lsgd_passed(cfg.milestones, cfg.n_milestones, s->epoch_fraction); i > 0; i--)
    b = (uint64_t)b * cfg.factor > UINT32_MAX ? UINT32_MAX : b * cfg.factor;
  if (cfg.max_batch > 0 && b > cfg.max_batch) b = cfg.max_batch;
  /* A multiple of the world size, but at least one sample per worker. */
  uint32_t ws = s->world_size > 0 ? s->world_size : 1;
  b -= b % ws;
  return b > ws ? b : ws;
}
