/* {{name}}: a synchronisation policy for lsgd-host. Edit describe, configure, plan and
 * outer_step; the host calls describe once, configure once, then plan before every step, and
 * outer_step after each step that plan made an average, with the drift of every parameter tensor
 * over the window. lsgd_kit.h (written by lsgd-plugin-build next to the bindings) has the
{{^stateful}}
 * describe/configure helpers.
{{/stateful}}
{{#stateful}}
 * describe/configure and snapshot/restore helpers.
{{/stateful}}
 *
 * This one is local SGD (Lin et al. 2018; Federated Averaging with every client): each rank
 * takes `period` steps on its own shard, the last of which ends the window (average), and the
{{^stateful}}
 * outer step is plain averaging, which makes the agreed weights the ranks' mean. */
{{/stateful}}
{{#stateful}}
 * outer step is plain averaging, which makes the agreed weights the ranks' mean.
 *
 * It keeps state between calls: the best metric seen so far, which doubles the period once it
 * reaches 0.5, and which the host saves with snapshot and brings back with restore. */
{{/stateful}}
#include "lsgd_kit.h"

/* Set by configure; a fresh instance (the host makes one after any fault) starts at the default. */
static uint32_t period = 8;
{{#stateful}}

/* The state: the best metric (test accuracy) seen so far, 0 before the first. It changes in the
 * policy calls, starts afresh with new parameters, and travels as its 8 bytes (an f64, wasm being
 * little-endian) through snapshot and restore. */
static double best = 0.0;
{{/stateful}}

void exports_lsgd_policy_plugin_describe(exports_lsgd_policy_plugin_plugin_info_t *ret) {
  lsgd_spec_t specs[] = {
      lsgd_spec_integer("period", 8,
                        "steps per window; the ranks average at a window's last step (>= 1)"),
  };
{{^stateful}}
  lsgd_info(ret, "{{name}}", "0.1.0", "Local SGD: average the ranks' weights every period steps",
            specs, 1);
{{/stateful}}
{{#stateful}}
  lsgd_info(ret, "{{name}}", "0.1.0",
            "Local SGD: average every period steps, twice as long once the best metric reaches 0.5",
            specs, 1);
{{/stateful}}
}

bool exports_lsgd_policy_plugin_configure(exports_lsgd_policy_plugin_list_param_t *params,
                                          lsgd_string_t *err) {
  exports_lsgd_policy_plugin_plugin_info_t info;
  exports_lsgd_policy_plugin_describe(&info);
  lsgd_params_t p;
  uint32_t h;
  bool ok = lsgd_resolve(&info, params, &p, err) && lsgd_u32_at_least(&p, "period", 1, &h, err);
  if (ok) period = h;
{{#stateful}}
  if (ok) best = 0.0; /* new parameters, a new state */
{{/stateful}}
  exports_lsgd_policy_plugin_plugin_info_free(&info);
  exports_lsgd_policy_plugin_list_param_free(params);
  return ok;
}

/* How step s->step moves: LOCAL (each rank on its own), AVERAGE (a local step that ends the
 * window) or SYNCHRONOUS (the gradients summed over the ranks, as without a sync policy; only at
 * a window's start, w->local_steps == 0). Every rank must decide alike: only s, w and the
 * plugin's state may count. */
exports_lsgd_policy_sync_step_kind_t exports_lsgd_policy_sync_plan(
    exports_lsgd_policy_sync_train_state_t *s, exports_lsgd_policy_sync_window_t *w) {
{{#stateful}}
  /* Taking the larger value twice changes nothing: the host may call again at the same step. */
  if (s->last_metric.is_some && s->last_metric.val > best) best = s->last_metric.val;
{{/stateful}}
  /* w->local_steps local steps are behind this one in the window. */
  uint64_t steps = (uint64_t)period{{#stateful}} * (best >= 0.5 ? 2 : 1){{/stateful}};
  return (uint64_t)w->local_steps >= steps - 1 ? EXPORTS_LSGD_POLICY_SYNC_STEP_KIND_AVERAGE
                                               : EXPORTS_LSGD_POLICY_SYNC_STEP_KIND_LOCAL;
}

/* The outer step on delta, the pseudo-gradient theta_global - theta_k averaged over the ranks:
 * m = momentum x m + delta; d = delta + momentum x m with nesterov, else m;
 * theta_global -= lr x lr_scale[i] x d. Plain averaging is lr 1 and no momentum; DiLoCo's outer
 * Nesterov step would be lr 0.7, momentum 0.9, nesterov true. lr_scale is empty (1 for every
 * tensor) or one multiplier per tensor, malloc'd, in the order of `tensors`, whose norms
 * (weight_norm, delta_norm, rank_delta_norm ...) describe the window's drift. */
void exports_lsgd_policy_sync_outer_step(exports_lsgd_policy_sync_train_state_t *s,
                                         exports_lsgd_policy_sync_window_t *w,
                                         exports_lsgd_policy_sync_list_tensor_drift_t *tensors,
                                         exports_lsgd_policy_sync_outer_update_t *ret) {
  ret->lr = 1.0;
  ret->momentum = 0.0;
  ret->nesterov = false;
  ret->lr_scale.ptr = NULL;
  ret->lr_scale.len = 0;
  /* The list is ours to free; the result is freed by the bindings after the host has read it. */
  exports_lsgd_policy_sync_list_tensor_drift_free(tensors);
}
{{#stateful}}

void exports_lsgd_policy_state_snapshot(lsgd_list_u8_t *ret) {
  lsgd_snapshot(ret, &best, sizeof best);
}

bool exports_lsgd_policy_state_restore(lsgd_list_u8_t *snapshot, lsgd_string_t *err) {
  return lsgd_restore(snapshot, &best, sizeof best, err);
}
{{/stateful}}
