//! Mixed precision (`--precision`), as `torch.amp` does it: the forward pass runs under
//! libtorch's autocast ([`Autocast`]), which computes convolutions and matrix products in bf16
//! or fp16 and keeps reductions, normalisations and the loss in fp32; the weights, their
//! gradients and the optimizer's state stay fp32 (the master copy), so the update is the fp32
//! update of lower-precision gradients.
//!
//! - **bf16** has fp32's exponent range: gradients cannot overflow where fp32's would not, so
//!   no loss scaling is needed. On CPU it is libtorch's CPU autocast (fast on CPUs with
//!   `avx512_bf16` or AMX, emulated elsewhere).
//! - **fp16** has a 5-bit exponent: small gradients underflow and large ones overflow. The
//!   loss is multiplied by a scale before the backward pass and every gradient divided by it
//!   after ([`LossScaler`], dynamic loss scaling as `torch.amp.GradScaler`): a step whose
//!   gradients hold an inf or NaN on any rank is skipped on every rank and the scale halved;
//!   after `--loss-scale-growth-interval` good steps in a row it doubles.
//!
//! Why the gradients are unscaled before the exchange rather than after: codecs and their
//! error-feedback residuals then see true gradients whatever the scale, a residual never mixes
//! two scales, and a skipped step moves no gradient bytes at all.

mod autocast;
mod scaler;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use tch::Kind;

pub use autocast::Autocast;
pub use scaler::{LossScaler, ScalerState};

use crate::Error;

/// The precision of the forward and backward passes (`--precision`).
#[derive(ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in fp32.
    #[default]
    Fp32,
    /// Autocast to bfloat16, fp32 master weights.
    Bf16,
    /// Autocast to float16 with dynamic loss scaling, fp32 master weights.
    Fp16,
}

impl Precision {
    /// The lower-precision kind autocast computes in (`None` for fp32).
    pub fn autocast_kind(self) -> Option<Kind> {
        match self {
            Precision::Fp32 => None,
            Precision::Bf16 => Some(Kind::BFloat16),
            Precision::Fp16 => Some(Kind::Half),
        }
    }

    /// Whether the loss is scaled (fp16 only).
    pub fn scales_loss(self) -> bool {
        self == Precision::Fp16
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        })
    }
}

/// The settings of `--precision` and fp16's loss scaling.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct MixedPrecision {
    /// The precision of the forward and backward passes.
    pub precision: Precision,
    /// fp16: the initial loss scale (`torch.amp.GradScaler`'s `init_scale`).
    pub loss_scale: f64,
    /// fp16: good steps in a row after which the scale doubles (`growth_interval`).
    pub loss_scale_growth_interval: u32,
}

impl Default for MixedPrecision {
    /// fp32; for fp16, GradScaler's defaults: 2^16, doubled after 2000 good steps.
    fn default() -> Self {
        MixedPrecision {
            precision: Precision::Fp32,
            loss_scale: 65536.0,
            loss_scale_growth_interval: 2000,
        }
    }
}

impl MixedPrecision {
    /// Refuses a loss scale that cannot scale.
    pub fn validate(&self) -> Result<(), Error> {
        let s = self.loss_scale;
        if !(s.is_finite() && s >= scaler::MIN_SCALE && (s as f32).is_finite()) {
            return Err(Error::Config(format!(
                "--loss-scale {s} must be a finite fp32 number of at least 2^-24"
            )));
        }
        if self.loss_scale_growth_interval == 0 {
            return Err(Error::Config(
                "--loss-scale-growth-interval must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The loss scaler of a run at this precision (`None` unless fp16).
    pub fn scaler(&self) -> Option<LossScaler> {
        self.precision
            .scales_loss()
            .then(|| LossScaler::new(self.loss_scale, self.loss_scale_growth_interval))
    }
}
