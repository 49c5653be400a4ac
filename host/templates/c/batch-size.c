/* {{name}}: a batch-size controller for lsgd-host. Edit describe, configure and global_batch;
 * the host calls describe once, configure once, then global_batch every step. lsgd_kit.h
 * (written by lsgd-plugin-build next to the bindings) has the describe/configure helpers. */
#include "lsgd_kit.h"

/* Set by configure; a fresh instance (the host makes one after any fault) starts at the default. */
static uint32_t factor = 1;

void exports_lsgd_policy_plugin_describe(exports_lsgd_policy_plugin_plugin_info_t *ret) {
  lsgd_spec_t specs[] = {
      lsgd_spec_integer("factor", 1, "multiplier on the configured global batch (>= 1)"),
  };
  lsgd_info(ret, "{{name}}", "0.1.0", "A constant global batch: the configured one x factor",
            specs, 1);
}

bool exports_lsgd_policy_plugin_configure(exports_lsgd_policy_plugin_list_param_t *params,
                                          lsgd_string_t *err) {
  exports_lsgd_policy_plugin_plugin_info_t info;
  exports_lsgd_policy_plugin_describe(&info);
  lsgd_params_t p;
  uint32_t f;
  bool ok = lsgd_resolve(&info, params, &p, err) && lsgd_u32_at_least(&p, "factor", 1, &f, err);
  if (ok) factor = f;
  exports_lsgd_policy_plugin_plugin_info_free(&info);
  exports_lsgd_policy_plugin_list_param_free(params);
  return ok;
}

uint32_t exports_lsgd_policy_batch_size_global_batch(
    exports_lsgd_policy_batch_size_train_state_t *s) {
  /* A multiple of the configured batch stays divisible by the world size. */
  uint64_t b = (uint64_t)s->global_batch * factor;
  return b > UINT32_MAX ? UINT32_MAX : (uint32_t)b;
}
