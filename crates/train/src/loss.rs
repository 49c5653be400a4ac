//! The training loss: cross-entropy with label smoothing (Szegedy et al. 2016; used for large
//! batches by Mikami et al. 2018): the target is `1 − ε` on the true class plus `ε/K` spread
//! over all K classes, so
//! `L = −(1 − ε)·log p_y − (ε/K)·Σ_k log p_k`, the definition `torch.nn.CrossEntropyLoss`
//! uses with `label_smoothing = ε`.

use tch::{Reduction, Tensor};

/// Mean smoothed cross-entropy of `logits` `[n, K]` against class indices `targets` `[n]`.
pub fn smoothed_cross_entropy(logits: &Tensor, targets: &Tensor, epsilon: f64) -> Tensor {
    logits.cross_entropy_loss::<Tensor>(targets, None, Reduction::Mean, -100, epsilon)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    /// The closed form above, in f64 from the logits.
    fn closed_form(logits: &[[f64; 3]], targets: &[usize], eps: f64) -> f64 {
        let k = 3.0;
        let mut total = 0.0;
        for (z, &y) in logits.iter().zip(targets) {
            let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + z.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            let logp: Vec<f64> = z.iter().map(|v| v - lse).collect();
            total += -(1.0 - eps) * logp[y] - eps / k * logp.iter().sum::<f64>();
        }
        total / logits.len() as f64
    }

    #[test]
    fn matches_the_closed_form_for_several_epsilons() {
        let z = [
            [2.0, -1.0, 0.5],
            [0.1, 0.2, 3.0],
            [-2.0, 4.0, 1.0],
            [0.0, 0.0, 0.0],
        ];
        let y = [0usize, 2, 0, 1];
        let logits = Tensor::from_slice(z.as_flattened())
            .view([4, 3])
            .to_kind(Kind::Double);
        let targets = Tensor::from_slice(&y.map(|v| v as i64));
        for eps in [0.0, 0.1, 0.25, 0.9] {
            let got = smoothed_cross_entropy(&logits, &targets, eps).double_value(&[]);
            let want = closed_form(&z, &y, eps);
            assert!((got - want).abs() < 1e-12, "ε={eps}: {got} vs {want}");
        }
        // Smoothing raises the loss of a confident correct prediction.
        let confident = Tensor::from_slice(&[10.0f64, 0.0, 0.0]).view([1, 3]);
        let t = Tensor::from_slice(&[0i64]);
        assert!(
            smoothed_cross_entropy(&confident, &t, 0.1).double_value(&[])
                > smoothed_cross_entropy(&confident, &t, 0.0).double_value(&[])
        );
    }
}
