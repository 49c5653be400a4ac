//! The `multistep` schedule (PyTorch's MultiStepLR) as a contract 0.4 component; the formula lives
//! in `lsgd_policy::multistep`.

wit_bindgen::generate!({ path: "../../wit/v0.4.0", world: "schedule-plugin" });
lsgd_policy::export_schedule!(lsgd_policy::multistep::MultiStep, momentum);
