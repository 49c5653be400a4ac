//! The order in which a model's gradients become ready, as the first step records it through
//! the hooks ([`super::ready`]), completed and agreed across ranks: the overlapped exchange lays
//! its buckets out in it ([`crate::exchange::buckets::layout_in`]), and every rank must make
//! the same collective calls in the same order, so every rank must have seen the same order.

use lsgd_collective::World;

use crate::{Error, Result};

/// The readiness order of `n` tensors from what the hooks reported: each index at its first
/// report, then the tensors that reported nothing (no gradient in that step: a branch not
/// taken) from the last to the first, as they would come in a backward pass.
pub fn complete(reported: &[usize], n: usize) -> Vec<usize> {
    let mut seen = vec![false; n];
    let mut order = Vec::with_capacity(n);
    for &i in reported {
        if i < n && !seen[i] {
            seen[i] = true;
            order.push(i);
        }
    }
    order.extend((0..n).rev().filter(|&i| !seen[i]));
    order
}

/// Where the orders of the ranks (`orders[r]`: rank r's) first differ from rank 0's, in words
/// that name the tensors (`names`, in the optimizer's order); `None` when they are the same.
pub fn disagreement(orders: &[Vec<usize>], names: &[String]) -> Option<String> {
    let first = orders.first()?;
    let name = |i: Option<&usize>| match i {
        Some(&i) => format!("`{}`", names.get(i).map_or("?", String::as_str)),
        None => "nothing".to_string(),
    };
    for (rank, order) in orders.iter().enumerate().skip(1) {
        if order == first {
            continue;
        }
        let at = (0..first.len().max(order.len()))
            .find(|&k| first.get(k) != order.get(k))
            .unwrap_or(0);
        return Some(format!(
            "gradients became ready in another order on rank {rank} than on rank 0: at position \
             {at}, rank 0 had {} and rank {rank} {} (a backward pass that depends on the rank's \
             data or state); every rank must exchange the same buckets in the same order, so \
             overlap cannot run this model: use --no-overlap",
            name(first.get(at)),
            name(order.get(at)),
        ));
    }
    None
}

/// This rank's readiness `order`, checked equal on every rank (one all-gather). A difference
/// is an error naming the first differing tensors when the step overlaps (`overlapping`);
/// otherwise the layout only has to be the same on every rank, and the optimizer's order is.
pub fn agree(
    world: &World,
    order: &[usize],
    names: &[String],
    overlapping: bool,
) -> Result<Vec<usize>> {
    let mine: Vec<u8> = order
        .iter()
        .flat_map(|&i| (i as u32).to_le_bytes())
        .collect();
    let (all, _) = world.all_gather_bytes(&mine)?;
    let orders: Vec<Vec<usize>> = all
        .iter()
        .map(|bytes| {
            bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize)
                .collect()
        })
        .collect();
    match disagreement(&orders, names) {
        Some(message) if overlapping => Err(Error::Exchange(message)),
        Some(_) => Ok((0..order.len()).collect()),
        None => Ok(order.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("t{i}")).collect()
    }

    #[test]
    fn the_order_keeps_first_reports_and_puts_silent_tensors_last_in_reverse() {
        assert_eq!(complete(&[4, 3, 3, 1, 0], 5), [4, 3, 1, 0, 2]);
        assert_eq!(complete(&[], 3), [2, 1, 0]);
        // An index beyond the tensors (a stale hook) is ignored.
        assert_eq!(complete(&[1, 7, 0], 2), [1, 0]);
    }

    #[test]
    fn a_different_order_on_a_rank_is_named_at_its_first_difference() {
        let same = vec![vec![2, 1, 0], vec![2, 1, 0]];
        assert_eq!(disagreement(&same, &names(3)), None);
        let differ = vec![vec![2, 1, 0], vec![2, 1, 0], vec![2, 0, 1]];
        let m = disagreement(&differ, &names(3)).unwrap();
        assert!(
            m.starts_with(
                "gradients became ready in another order on rank 2 than on rank 0: at position \
                 1, rank 0 had `t1` and rank 2 `t0`"
            ),
            "{m}"
        );
        assert!(m.ends_with("use --no-overlap"), "{m}");
        let shorter = vec![vec![1, 0], vec![1]];
        let m = disagreement(&shorter, &names(2)).unwrap();
        assert!(m.contains("rank 0 had `t0` and rank 1 nothing"), "{m}");
    }

    #[test]
    fn one_rank_agrees_with_itself() {
        let world = World::single();
        assert_eq!(agree(&world, &[1, 0], &names(2), true).unwrap(), [1, 0]);
    }
}
