//! The `batch-ramp` batch-size controller as a component; the formula lives in `lsgd_policy::batch_ramp`.

wit_bindgen::generate!({ path: "../../wit/v0.1.0", world: "batch-size-plugin" });
lsgd_policy::export_batch_size!(lsgd_policy::batch_ramp::BatchRamp);
