//! The `constant-batch` batch-size policy as a component; the formula lives in `lsgd_policy::constant_batch`.

wit_bindgen::generate!({ path: "../../wit/v0.1.0", world: "batch-size-plugin" });
lsgd_policy::export_batch_size!(lsgd_policy::constant_batch::ConstantBatch);
