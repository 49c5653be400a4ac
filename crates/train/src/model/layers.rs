//! Layers with PyTorch's default initialisation. tch's defaults differ (Kaiming-uniform with
//! the ReLU gain, about 2.45× wider than PyTorch's, zero conv bias, BatchNorm γ uniform in
//! [0, 1)); a model built here starts from the same distribution as the PyTorch model a user
//! compares against, which matters for the early steps that warmup exists to protect.

use tch::nn::{self, Init};

/// PyTorch's `kaiming_uniform_(a=√5)` bound for a weight of fan-in `fan_in`: 1/√fan_in. The
/// bias of Linear and Conv uses the same bound.
fn torch_bound(fan_in: i64) -> Init {
    let bound = 1.0 / (fan_in as f64).sqrt();
    Init::Uniform {
        lo: -bound,
        up: bound,
    }
}

/// A fully connected layer initialised as `torch.nn.Linear`.
pub fn linear(p: nn::Path, inputs: i64, outputs: i64) -> nn::Linear {
    nn::linear(
        p,
        inputs,
        outputs,
        nn::LinearConfig {
            ws_init: torch_bound(inputs),
            bs_init: Some(torch_bound(inputs)),
            bias: true,
        },
    )
}

/// A `k×k` convolution initialised as `torch.nn.Conv2d`; no bias, since every convolution
/// here is followed by BatchNorm, whose β makes a bias redundant.
pub fn conv(p: nn::Path, inputs: i64, outputs: i64, k: i64, stride: i64) -> nn::Conv2D {
    let fan_in = inputs * k * k;
    nn::conv2d(
        p,
        inputs,
        outputs,
        k,
        nn::ConvConfig {
            stride,
            padding: k / 2,
            bias: false,
            ws_init: torch_bound(fan_in),
            bs_init: torch_bound(fan_in),
            ..Default::default()
        },
    )
}

/// BatchNorm over channels as `torch.nn.BatchNorm2d` (γ = 1, β = 0, momentum 0.1, ε = 1e-5),
/// or with γ = 0 for Goyal's zero-initialised last BN of a residual block.
pub fn batch_norm(p: nn::Path, channels: i64, zero_gamma: bool) -> nn::BatchNorm {
    nn::batch_norm2d(
        p,
        channels,
        nn::BatchNormConfig {
            ws_init: Init::Const(if zero_gamma { 0.0 } else { 1.0 }),
            bs_init: Init::Const(0.0),
            ..Default::default()
        },
    )
}
