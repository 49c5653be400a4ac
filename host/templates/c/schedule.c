/* {{name}}: a learning-rate schedule for lsgd-host. Edit describe, configure and learning_rate;
 * the host calls describe once, configure once, then learning_rate every step. lsgd_kit.h
 * (written by lsgd-plugin-build next to the bindings) has the describe/configure helpers. */
#include "lsgd_kit.h"

/* Set by configure; a fresh instance (the host makes one after any fault) starts at the default. */
static double scale = 1.0;

void exports_lsgd_policy_plugin_describe(exports_lsgd_policy_plugin_plugin_info_t *ret) {
  lsgd_spec_t specs[] = {
      lsgd_spec_float("scale", 1.0, "multiplier on the linearly scaled learning rate (>= 0)"),
  };
  lsgd_info(ret, "{{name}}", "0.1.0", "A constant learning rate: base_lr x B/B_ref x scale",
            specs, 1);
}

bool exports_lsgd_policy_plugin_configure(exports_lsgd_policy_plugin_list_param_t *params,
                                          lsgd_string_t *err) {
  exports_lsgd_policy_plugin_plugin_info_t info;
  exports_lsgd_policy_plugin_describe(&info);
  lsgd_params_t p;
  double s;
  bool ok = lsgd_resolve(&info, params, &p, err) && lsgd_float_at_least(&p, "scale", 0.0, &s, err);
  if (ok) scale = s;
  exports_lsgd_policy_plugin_plugin_info_free(&info);
  exports_lsgd_policy_plugin_list_param_free(params);
  return ok;
}

double exports_lsgd_policy_schedule_learning_rate(exports_lsgd_policy_schedule_train_state_t *s) {
  double ratio = s->reference_batch == 0 ? 1.0
                                         : (double)s->global_batch / (double)s->reference_batch;
  return s->base_lr * ratio * scale;
}
