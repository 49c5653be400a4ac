//! The `warmup` schedule (Goyal et al.) as a component; the formula lives in `lsgd_policy::warmup`.

wit_bindgen::generate!({ path: "../../wit/v0.1.0", world: "schedule-plugin" });
lsgd_policy::export_schedule!(lsgd_policy::warmup::Warmup);
