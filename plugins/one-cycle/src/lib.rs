//! The `one-cycle` schedule (PyTorch's OneCycleLR, learning rate and momentum) as a contract 0.4
//! component; the formula lives in `lsgd_policy::one_cycle`.

wit_bindgen::generate!({ path: "../../wit/v0.4.0", world: "schedule-plugin" });
lsgd_policy::export_schedule!(lsgd_policy::one_cycle::OneCycle, momentum);
