/* {{name}}: a label-smoothing policy for lsgd-host. Edit describe, configure and epsilon;
 * the host calls describe once, configure once, then epsilon every step. lsgd_kit.h
 * (written by lsgd-plugin-build next to the bindings) has the describe/configure helpers. */
#include "lsgd_kit.h"

/* Set by configure; a fresh instance (the host makes one after any fault) starts at the default. */
static float epsilon = 0.1f;

void exports_lsgd_policy_plugin_describe(exports_lsgd_policy_plugin_plugin_info_t *ret) {
  lsgd_spec_t specs[] = {
      lsgd_spec_float("epsilon", 0.1, "label-smoothing epsilon, in [0, 1)"),
  };
  lsgd_info(ret, "{{name}}", "0.1.0", "A constant label-smoothing epsilon", specs, 1);
}

bool exports_lsgd_policy_plugin_configure(exports_lsgd_policy_plugin_list_param_t *params,
                                          lsgd_string_t *err) {
  exports_lsgd_policy_plugin_plugin_info_t info;
  exports_lsgd_policy_plugin_describe(&info);
  lsgd_params_t p;
  bool ok = lsgd_resolve(&info, params, &p, err);
  if (ok) {
    double e = lsgd_float(&p, "epsilon");
    char buf[400];
    /* Checked after the f32 conversion the contract requires: 0.999999999 rounds to 1. */
    if (!(e >= 0.0 && (float)e < 1.0f))
      ok = lsgd_fail(err, "epsilon must be in [0, 1), got %s", lsgd_fmt_f64(buf, e));
    else
      epsilon = (float)e;
  }
  exports_lsgd_policy_plugin_plugin_info_free(&info);
  exports_lsgd_policy_plugin_list_param_free(params);
  return ok;
}

float exports_lsgd_policy_label_smoothing_epsilon(
    exports_lsgd_policy_label_smoothing_train_state_t *s) {
  return epsilon;
}
