//! The `constant` schedule as a component; the formula lives in `lsgd_policy::constant`.

wit_bindgen::generate!({ path: "../../wit/v0.1.0", world: "schedule-plugin" });
lsgd_policy::export_schedule!(lsgd_policy::constant::Constant);
