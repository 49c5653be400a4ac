//! The `layer-rate` interface of contract 0.3 (one learning-rate multiplier per parameter
//! tensor) as plain Rust, the pieces LARS and LAMB share, and the registry of their native twins.

use crate::{ParamSpec, Params, Policy, State, configure_given, lamb, lars};

/// What a parameter tensor is, as the host classifies it from the model (the WIT `role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A weight of a convolution or a linear layer (two or more dimensions).
    Weight,
    /// A bias of a convolution or a linear layer.
    Bias,
    /// A BatchNorm scale (gamma) or shift (beta).
    BatchNorm,
}

/// One parameter tensor at one step, described by its norms (the WIT `tensor-norms`).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorNorms {
    /// The parameter's name, e.g. `conv1.weight`.
    pub name: String,
    /// Its shape, outermost first.
    pub shape: Vec<u32>,
    /// Weight, bias or BatchNorm.
    pub role: Role,
    /// ‖w‖: the weights before this step's update.
    pub weight_norm: f64,
    /// ‖g‖: the gradient summed over the ranks, without weight decay.
    pub grad_norm: f64,
    /// ‖u‖: the base optimizer's update for a learning rate of 1, weight decay included.
    pub update_norm: f64,
    /// The weight decay the optimizer applies to this tensor (0 where it is excluded).
    pub weight_decay: f64,
}

/// A layer-wise rate policy (WIT interface `layer-rate`).
pub trait LayerRate: Policy {
    /// One multiplier of the step's learning rate per tensor, in the order of `tensors`, each
    /// finite and >= 0.
    fn multipliers(&self, s: &State, tensors: &[TensorNorms]) -> Vec<f64>;
}

/// The reference layer-rate policies, by `describe()` name; separate from [`crate::NAMES`]
/// because their native twins take tensors and return one value per tensor.
pub const LAYER_RATE_NAMES: [&str; 2] = ["lars", "lamb"];

/// A reference layer-rate policy compiled natively: the multipliers for a state and its tensors.
pub type NativeLayerRateFn = Box<dyn FnMut(&State, &[TensorNorms]) -> Vec<f64> + Send>;

/// The native twin of the layer-rate policy named `name`, configured with `params` over its
/// defaults; `None` for a name not in [`LAYER_RATE_NAMES`].
pub fn native_layer_rate(name: &str, params: &Params) -> Option<Result<NativeLayerRateFn, String>> {
    fn twin<P: LayerRate + Send + 'static>(params: &Params) -> Result<NativeLayerRateFn, String> {
        let p = configure_given::<P>(params)?;
        Ok(Box::new(move |s, t| p.multipliers(s, t)))
    }
    Some(match name {
        "lars" => twin::<lars::Lars>(params),
        "lamb" => twin::<lamb::Lamb>(params),
        _ => return None,
    })
}

/// The `exclude_bias_and_bn` parameter LARS and LAMB share.
pub(crate) fn exclude_spec() -> ParamSpec {
    ParamSpec::boolean(
        "exclude_bias_and_bn",
        true,
        "leave biases and BatchNorm parameters at multiplier 1",
    )
}

/// Whether a tensor keeps multiplier 1 because of its role: both papers adapt only weights,
/// since a bias or a BatchNorm shift has no meaningful scale to compare its update against.
pub(crate) fn excluded(role: Role, exclude_bias_and_bn: bool) -> bool {
    exclude_bias_and_bn && role != Role::Weight
}

/// `ratio` where both norms it came from were positive and it is finite, else 1: a zero norm
/// (a freshly zeroed tensor, a layer with no gradient) or a non-finite one (an overflowing
/// gradient) carries no scale, and the contract requires a finite multiplier either way.
pub(crate) fn guarded(
    numerator_norm: f64,
    denominator_norm: f64,
    ratio: impl FnOnce() -> f64,
) -> f64 {
    let usable = |n: f64| n.is_finite() && n > 0.0;
    if !(usable(numerator_norm) && usable(denominator_norm)) {
        return 1.0;
    }
    let r = ratio();
    if r.is_finite() { r } else { 1.0 }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A tensor with the given norms (weight, gradient, update) and weight decay.
    pub fn tensor(role: Role, w: f64, g: f64, u: f64, wd: f64) -> TensorNorms {
        TensorNorms {
            name: "t".to_owned(),
            shape: vec![4, 4],
            role,
            weight_norm: w,
            grad_norm: g,
            update_norm: u,
            weight_decay: wd,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::tensor;
    use super::*;
    use crate::Value;
    use crate::testing::state_at;

    #[test]
    fn every_layer_rate_name_has_a_twin_of_that_describe_name() {
        assert_eq!(
            [lars::Lars::info().name, lamb::Lamb::info().name],
            LAYER_RATE_NAMES
        );
        let t = [tensor(Role::Weight, 2.0, 1.0, 4.0, 0.0)];
        for name in LAYER_RATE_NAMES {
            let mut f = native_layer_rate(name, &Params::default())
                .unwrap_or_else(|| panic!("{name} is not in the registry"))
                .unwrap_or_else(|e| panic!("{name} with its defaults: {e}"));
            let m = f(&state_at(1.0), &t);
            assert_eq!(m.len(), 1, "{name}");
            assert!(m[0].is_finite() && m[0] >= 0.0, "{name}: {m:?}");
        }
    }

    #[test]
    fn parameters_reach_the_twin_and_are_checked() {
        let given = |name: &str, v: Value| Params(vec![(name.to_owned(), v)]);
        let t = [tensor(Role::Weight, 2.0, 1.0, 4.0, 0.0)];
        let mut lars = native_layer_rate("lars", &given("coefficient", Value::Float(0.5)))
            .unwrap()
            .unwrap();
        assert_eq!(lars(&state_at(0.0), &t), vec![1.0]);
        let e = native_layer_rate("lamb", &given("max_ratio", Value::Float(-1.0)))
            .unwrap()
            .err()
            .unwrap();
        assert!(e.contains("max_ratio"), "{e}");
    }

    #[test]
    fn unknown_and_per_step_names_are_none() {
        for name in ["warmup", "plateau", "", "LARS"] {
            assert!(
                native_layer_rate(name, &Params::default()).is_none(),
                "{name}"
            );
        }
    }

    #[test]
    fn guard_falls_back_to_one() {
        let r = || 0.25;
        assert_eq!(guarded(1.0, 2.0, r), 0.25);
        assert_eq!(guarded(0.0, 2.0, r), 1.0);
        assert_eq!(guarded(1.0, 0.0, r), 1.0);
        assert_eq!(guarded(f64::NAN, 2.0, r), 1.0);
        assert_eq!(guarded(1.0, f64::INFINITY, r), 1.0);
        assert_eq!(guarded(1.0, 1e-300, || 1e300 / 1e-300), 1.0, "overflow");
        assert!(excluded(Role::Bias, true) && excluded(Role::BatchNorm, true));
        assert!(!excluded(Role::Weight, true) && !excluded(Role::Bias, false));
    }
}
