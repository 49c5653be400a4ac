//! The `linear` schedule (PyTorch's LinearLR) as a contract 0.4 component; the formula lives in
//! `lsgd_policy::linear`.

wit_bindgen::generate!({ path: "../../wit/v0.4.0", world: "schedule-plugin" });
lsgd_policy::export_schedule!(lsgd_policy::linear::Linear, momentum);
