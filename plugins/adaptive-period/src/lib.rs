//! The `adaptive-period` sync policy as a stateful contract 0.5 component; the rule and its
//! state live in `lsgd_policy::adaptive_period`.

wit_bindgen::generate!({ path: "../../wit/v0.5.0", world: "stateful-sync-plugin" });
lsgd_policy::export_stateful_sync!(lsgd_policy::adaptive_period::AdaptivePeriod);
