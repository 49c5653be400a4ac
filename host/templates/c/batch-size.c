/* {{name}}: a batch-size controller for lsgd-host. Edit describe, configure and global_batch;
 * the host calls describe once, configure once, then global_batch every step. lsgd_kit.h
{{^stateful}}
 * (written by lsgd-plugin-build next to the bindings) has the describe/configure helpers. */
{{/stateful}}
{{#stateful}}
 * (written by lsgd-plugin-build next to the bindings) has the describe/configure and
 * snapshot/restore helpers.
 *
 * It keeps state between calls: the best metric seen so far, which doubles the batch once it
 * reaches 0.5, and which the host saves with snapshot and brings back with restore. */
{{/stateful}}
#include "lsgd_kit.h"

/* Set by configure; a fresh instance (the host makes one after any fault) starts at the default. */
static uint32_t factor = 1;
{{#stateful}}

/* The state: the best metric (test accuracy) seen so far, 0 before the first. It changes in the
 * policy calls, starts afresh with new parameters, and travels as its 8 bytes (an f64, wasm being
 * little-endian) through snapshot and restore. */
static double best = 0.0;
{{/stateful}}

void exports_lsgd_policy_plugin_describe(exports_lsgd_policy_plugin_plugin_info_t *ret) {
  lsgd_spec_t specs[] = {
      lsgd_spec_integer("factor", 1, "multiplier on the configured global batch (>= 1)"),
  };
{{^stateful}}
  lsgd_info(ret, "{{name}}", "0.1.0", "A constant global batch: the configured one x factor",
            specs, 1);
{{/stateful}}
{{#stateful}}
  lsgd_info(ret, "{{name}}", "0.1.0",
            "The configured global batch x factor, doubled once the best metric reaches 0.5",
            specs, 1);
{{/stateful}}
}

bool exports_lsgd_policy_plugin_configure(exports_lsgd_policy_plugin_list_param_t *params,
                                          lsgd_string_t *err) {
  exports_lsgd_policy_plugin_plugin_info_t info;
  exports_lsgd_policy_plugin_describe(&info);
  lsgd_params_t p;
  uint32_t f;
  bool ok = lsgd_resolve(&info, params, &p, err) && lsgd_u32_at_least(&p, "factor", 1, &f, err);
  if (ok) factor = f;
{{#stateful}}
  if (ok) best = 0.0; /* new parameters, a new state */
{{/stateful}}
  exports_lsgd_policy_plugin_plugin_info_free(&info);
  exports_lsgd_policy_plugin_list_param_free(params);
  return ok;
}

uint32_t exports_lsgd_policy_batch_size_global_batch(
    exports_lsgd_policy_batch_size_train_state_t *s) {
{{#stateful}}
  /* Taking the larger value twice changes nothing: the host may call again at the same step. */
  if (s->last_metric.is_some && s->last_metric.val > best) best = s->last_metric.val;
{{/stateful}}
  /* A multiple of the configured batch stays divisible by the world size. */
  uint64_t b = (uint64_t)s->global_batch * factor{{#stateful}} * (best >= 0.5 ? 2 : 1){{/stateful}};
  return b > UINT32_MAX ? UINT32_MAX : (uint32_t)b;
}
{{#stateful}}

void exports_lsgd_policy_state_snapshot(lsgd_list_u8_t *ret) {
  lsgd_snapshot(ret, &best, sizeof best);
}

bool exports_lsgd_policy_state_restore(lsgd_list_u8_t *snapshot, lsgd_string_t *err) {
  return lsgd_restore(snapshot, &best, sizeof best, err);
}
{{/stateful}}
