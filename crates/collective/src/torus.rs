//! Sony's 2D-torus all-reduce (Mikami et al. 2018) on an X×Y grid of ranks.
//!
//! Rank r sits in row r / X, column r mod X. Reduce-scatter along the rows (rings of X ranks),
//! all-reduce the owned 1/X of the vector along the columns (rings of Y ranks), all-gather
//! along the rows. Cost 2(X+Y−2)α + 2((p−1)/p)·n·β: ring bandwidth with O(√p) latency.
//! Every rank of a column owns the same chunk index after the row reduce-scatter, and the
//! column ring finishes each piece on one rank, so all ranks end with the same bytes.
//!
//! X = 1 or Y = 1 is a plain ring. The default shape is the near-square factorisation with
//! X ≥ Y, so the column phase, which handles n/X floats, gets the smaller share.

use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use super::chunks::{Format, chunk};
use super::hierarchical::world_ranks;
use super::{Error, Result, ring, watchdog};

/// The default grid for `p` ranks: X·Y = p, Y the largest divisor of p not above √p.
pub fn default_shape(p: usize) -> (usize, usize) {
    let y = (1..=p)
        .take_while(|d| d * d <= p)
        .filter(|&d| p.is_multiple_of(d))
        .last()
        .unwrap_or(1);
    (p / y, y)
}

/// Checks that `shape` fits `p` ranks.
pub fn check_shape(shape: (usize, usize), p: usize) -> Result<()> {
    if shape.0 * shape.1 != p {
        return Err(Error::TorusShape { shape, world: p });
    }
    Ok(())
}

/// The row and column sub-communicators of one grid.
pub struct Grid {
    shape: (usize, usize),
    row: SimpleCommunicator,
    column: SimpleCommunicator,
}

impl Grid {
    /// Puts both communicators under fault tolerance's error handler ([`crate::ulfm`]).
    pub(crate) fn watch(&self) {
        use mpi::raw::AsRaw;
        crate::ulfm::watch(self.row.as_raw());
        crate::ulfm::watch(self.column.as_raw());
    }

    /// Splits `world` into rows of `shape.0` ranks and columns of `shape.1` (collective).
    pub fn new(world: &SimpleCommunicator, shape: (usize, usize)) -> Result<Grid> {
        let (p, r) = (world.size() as usize, world.rank());
        check_shape(shape, p)?;
        let x = shape.0 as i32;
        let split = |color: i32, key: i32| {
            world
                .split_by_color_with_key(Color::with_value(color), key)
                .ok_or(Error::CommSplit)
        };
        let row = split(r / x, r % x)?;
        let column = split(r % x, r / x)?;
        for c in [&row, &column] {
            watchdog::register(c, world_ranks(c, r));
        }
        Ok(Grid { shape, row, column })
    }

    /// The grid's X×Y.
    pub fn shape(&self) -> (usize, usize) {
        self.shape
    }

    /// In-place all-reduce (sum) over the whole grid. Returns the bytes sent.
    pub fn all_reduce<E: Format>(
        &self,
        buf: &mut [E::Stored],
        scratch: &mut Vec<E::Stored>,
    ) -> u64 {
        let x = self.shape.0;
        let mut sent = ring::reduce_scatter::<E>(&self.row, buf, scratch);
        let owned = chunk(buf.len(), x, ring::owned_chunk(self.row.rank() as usize, x));
        sent += ring::all_reduce::<E>(&self.column, &mut buf[owned], scratch);
        sent + ring::all_gather(&self.row, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_shapes_are_near_square_with_x_at_least_y() {
        assert_eq!(default_shape(1), (1, 1));
        assert_eq!(default_shape(4), (2, 2));
        assert_eq!(default_shape(5), (5, 1));
        assert_eq!(default_shape(6), (3, 2));
        assert_eq!(default_shape(8), (4, 2));
        assert_eq!(default_shape(1024), (32, 32));
        assert_eq!(default_shape(3456), (64, 54));
    }

    #[test]
    fn a_shape_must_cover_the_world() {
        assert!(check_shape((2, 2), 4).is_ok());
        assert!(check_shape((2, 3), 4).is_err());
    }
}
