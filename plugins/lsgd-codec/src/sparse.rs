//! PLACEHOLDER: shared sparse payload format.
