//! The `plateau` schedule (PyTorch's ReduceLROnPlateau) as a stateful component; the formula
//! and its state live in `lsgd_policy::plateau`.

wit_bindgen::generate!({ path: "../../wit/v0.3.0", world: "stateful-schedule-plugin" });
lsgd_policy::export_stateful_schedule!(lsgd_policy::plateau::Plateau);
