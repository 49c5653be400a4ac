//! A multilayer perceptron: the flattened image through two hidden ReLU layers.

use tch::Tensor;
use tch::nn::{self, Module, ModuleT};

use super::layers::linear;

/// Hidden widths.
const HIDDEN: [i64; 2] = [256, 256];

/// `inputs → 256 → 256 → classes` with ReLU between.
#[derive(Debug)]
pub struct Mlp {
    layers: Vec<nn::Linear>,
}

impl Mlp {
    /// Builds the layers under `p`.
    pub fn new(p: &nn::Path, inputs: i64, classes: i64) -> Self {
        let widths = [inputs, HIDDEN[0], HIDDEN[1], classes];
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, w)| linear(p / format!("fc{}", i + 1), w[0], w[1]))
            .collect();
        Mlp { layers }
    }
}

impl ModuleT for Mlp {
    fn forward_t(&self, xs: &Tensor, _train: bool) -> Tensor {
        let mut x = xs.flatten(1, -1);
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x);
            if i + 1 < self.layers.len() {
                x = x.relu();
            }
        }
        x
    }
}
