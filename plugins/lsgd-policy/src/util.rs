//! Range checks and milestone handling shared by the reference policies.

use crate::{Params, State};

/// A finite float parameter `>= min`; NaN and infinities are rejected because every formula
/// would pass them straight through to the learning rate.
pub(crate) fn float_at_least(p: &Params, name: &str, min: f64) -> Result<f64, String> {
    let v = p.float(name)?;
    if v.is_finite() && v >= min {
        Ok(v)
    } else {
        Err(format!("{name} must be >= {min}, got {v}"))
    }
}

/// A finite float parameter `> min`, for factors where the bound itself would disable the policy.
pub(crate) fn float_above(p: &Params, name: &str, min: f64) -> Result<f64, String> {
    let v = p.float(name)?;
    if v.is_finite() && v > min {
        Ok(v)
    } else {
        Err(format!("{name} must be > {min}, got {v}"))
    }
}

/// A counter parameter (patience, cooldown): an integer `>= 0`, widened to the `u64` that state
/// counters use.
pub(crate) fn count(p: &Params, name: &str) -> Result<u64, String> {
    let v = p.integer(name)?;
    u64::try_from(v).map_err(|_| format!("{name} must be >= 0, got {v}"))
}

/// A finite float parameter in `[lo, hi]`.
pub(crate) fn float_in(p: &Params, name: &str, lo: f64, hi: f64) -> Result<f64, String> {
    let v = p.float(name)?;
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{name} must be in [{lo}, {hi}], got {v}"))
    }
}

/// A finite float parameter in `[lo, hi)`, for momenta, which must stay below 1.
pub(crate) fn float_below(p: &Params, name: &str, lo: f64, hi: f64) -> Result<f64, String> {
    let v = p.float(name)?;
    if v.is_finite() && v >= lo && v < hi {
        Ok(v)
    } else {
        Err(format!("{name} must be in [{lo}, {hi}), got {v}"))
    }
}

/// A step count where 0 means the run's own length, resolved per state because
/// `total_steps` follows the global batch; never 0, so no formula divides by it.
pub(crate) fn steps_or_run(steps: u64, s: &State) -> u64 {
    if steps == 0 { s.total_steps } else { steps }.max(1)
}

/// An integer parameter in `[min, u32::MAX]`, since batches and factors are `u32` in the contract.
pub(crate) fn u32_at_least(p: &Params, name: &str, min: u32) -> Result<u32, String> {
    let v = p.integer(name)?;
    u32::try_from(v)
        .ok()
        .filter(|&v| v >= min)
        .ok_or_else(|| format!("{name} must be in [{min}, {}], got {v}", u32::MAX))
}

/// Epoch milestones: finite, `>= 0` and ascending, so "passed" is a prefix of the list.
pub(crate) fn milestones(p: &Params, name: &str) -> Result<Vec<f64>, String> {
    let list = p.float_list(name)?;
    let mut prev = 0.0;
    for &m in list {
        if !(m.is_finite() && m >= 0.0) {
            return Err(format!("{name} must all be >= 0, got {m}"));
        }
        if m < prev {
            return Err(format!("{name} must be ascending, got {m} after {prev}"));
        }
        prev = m;
    }
    Ok(list.to_vec())
}

/// How many milestones the fractional epoch `e` has reached (`e >= m`).
pub(crate) fn passed(milestones: &[f64], e: f64) -> usize {
    milestones.iter().take_while(|&&m| e >= m).count()
}
