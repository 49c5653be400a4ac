//! A stateful codec's state between steps (contract 0.4: PowerSGD's warm-start Q): one byte
//! string per bucket, the same on every rank, since the codec computes it from what every rank
//! received. The host keeps it, hands it to every call of a step in the bucket's meta, makes
//! what `next-state` returned the state once every bucket of the step is through, puts the old
//! one back when the step is rolled back, checkpoints it (`codec.state.bucket{b}`, rank 0's:
//! every rank holds the same) and hands it unchanged to every rank of a resume, whatever their
//! number.

use tch::{Kind, Tensor};

use crate::{Error, Result};

/// Prefix of a stateful codec's per-bucket state in checkpoints: `codec.state.bucket{b}`.
pub const STATE_PREFIX: &str = "codec.state.";

/// Every bucket's codec state, and the one before the last commit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Carried {
    now: Vec<Vec<u8>>,
    /// The state before the last commit, until the next one.
    previous: Option<Vec<Vec<u8>>>,
}

impl Carried {
    /// The empty state of `buckets` buckets, as at the first step.
    pub fn new(buckets: usize) -> Carried {
        Carried {
            now: vec![Vec::new(); buckets],
            previous: None,
        }
    }

    /// Bucket `b`'s state for this step.
    pub fn get(&self, b: usize) -> &[u8] {
        &self.now[b]
    }

    /// Every bucket's state, in bucket order.
    pub fn buckets(&self) -> &[Vec<u8>] {
        &self.now
    }

    /// Makes a whole step's new states (in bucket order) the state, keeping the old one for
    /// [`Carried::rollback`].
    pub fn commit(&mut self, next: Vec<Vec<u8>>) {
        debug_assert_eq!(next.len(), self.now.len());
        self.previous = Some(std::mem::replace(&mut self.now, next));
    }

    /// Puts back the state from before the last commit (once).
    pub fn rollback(&mut self) {
        if let Some(previous) = self.previous.take() {
            self.now = previous;
        }
    }

    /// The non-empty states as checkpoint tensors (bytes); an empty state is saved as no
    /// tensor, which reads back as empty.
    pub fn tensors(&self) -> Vec<(String, Tensor)> {
        self.now
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .map(|(b, s)| (key(b), Tensor::from_slice(s)))
            .collect()
    }

    /// The state a checkpoint saved; a bucket it has no tensor for starts empty (a codec
    /// that kept nothing yet, or a checkpoint written before the codec was stateful).
    pub fn restore(&mut self, tensors: &[(String, Tensor)]) -> Result<()> {
        for (b, state) in self.now.iter_mut().enumerate() {
            let key = key(b);
            *state = match tensors.iter().find(|(n, _)| *n == key) {
                Some((_, t)) if t.kind() != Kind::Uint8 => {
                    return Err(Error::Checkpoint(format!(
                        "codec state `{key}` is {:?}, not bytes",
                        t.kind()
                    )));
                }
                Some((_, t)) => Vec::<u8>::try_from(t.flatten(0, -1))?,
                None => Vec::new(),
            };
        }
        if let Some((n, _)) = tensors.iter().find(|(n, _)| {
            n.strip_prefix(STATE_PREFIX)
                .and_then(|b| b.strip_prefix("bucket"))
                .and_then(|b| b.parse::<usize>().ok())
                .is_some_and(|b| b >= self.now.len())
        }) {
            return Err(Error::Checkpoint(format!(
                "codec state `{n}` is for a bucket this run does not have ({} buckets): the \
                 checkpoint was written with another bucket layout",
                self.now.len()
            )));
        }
        self.previous = None;
        Ok(())
    }
}

fn key(b: usize) -> String {
    format!("{STATE_PREFIX}bucket{b}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_roll_back_once_and_checkpoints_round_trip() {
        let mut c = Carried::new(3);
        assert!(c.tensors().is_empty(), "nothing kept yet, nothing saved");
        c.commit(vec![vec![1, 2], Vec::new(), vec![3]]);
        c.commit(vec![vec![4, 5], Vec::new(), vec![6]]);
        c.rollback();
        assert_eq!(c.buckets(), [vec![1, 2], vec![], vec![3]]);
        c.rollback();
        assert_eq!(c.get(0), [1, 2], "a second rollback has nothing to undo");
        let saved = c.tensors();
        assert_eq!(
            saved.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["codec.state.bucket0", "codec.state.bucket2"]
        );
        let mut back = Carried::new(3);
        back.restore(&saved).unwrap();
        assert_eq!(back.buckets(), c.buckets());
        let mut fewer = Carried::new(2);
        let e = fewer.restore(&saved).unwrap_err().to_string();
        assert!(
            e.contains("`codec.state.bucket2`") && e.contains("2 buckets"),
            "{e}"
        );
        let floats = vec![(
            "codec.state.bucket0".to_string(),
            Tensor::from_slice(&[1f32]),
        )];
        let e = back.restore(&floats).unwrap_err().to_string();
        assert!(e.contains("not bytes"), "{e}");
    }
}
