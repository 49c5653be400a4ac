//! Evaluation on the test split: mean cross-entropy (unsmoothed, so runs with different ε are
//! comparable) and top-1 accuracy, with BatchNorm using its running statistics.

use tch::{Kind, Reduction};

use super::tensors::DataTensors;
use crate::Result;
use crate::model::Model;
use crate::precision::Autocast;

/// Samples per forward pass during evaluation.
const EVAL_BATCH: usize = 1000;

/// Test loss and top-1 accuracy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean cross-entropy.
    pub loss: f64,
    /// Fraction of samples whose arg-max logit is the label.
    pub accuracy: f64,
}

/// Evaluates `model` on the test split of `data`, its forward pass autocast to `autocast` if
/// given (the precision the run trains in).
pub fn evaluate(
    model: &Model,
    data: &mut DataTensors,
    autocast: Option<Kind>,
) -> Result<Evaluation> {
    let _guard = tch::no_grad_guard();
    let n = data.test.len;
    let (mut loss_sum, mut correct) = (0.0, 0i64);
    let mut start = 0;
    data.prefetch_test(0, EVAL_BATCH.min(n));
    while start < n {
        let len = EVAL_BATCH.min(n - start);
        // Image files of the next chunk decode while this one runs.
        data.prefetch_test(start + len, EVAL_BATCH.min(n - start - len));
        let (x, y) = data.test_batch(start, len)?;
        let logits = {
            let _autocast = Autocast::enter(x.device(), autocast)?;
            model.forward(&x, false)?.to_kind(Kind::Float)
        };
        loss_sum += logits
            .cross_entropy_loss::<tch::Tensor>(&y, None, Reduction::Sum, -100, 0.0)
            .double_value(&[]);
        correct += logits
            .argmax(-1, false)
            .eq_tensor(&y)
            .sum(Kind::Int64)
            .int64_value(&[]);
        start += len;
    }
    Ok(Evaluation {
        loss: loss_sum / n as f64,
        accuracy: correct as f64 / n as f64,
    })
}
