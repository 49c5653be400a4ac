//! One bucket's exchange through a codec, written once: every round's encode, the length
//! agreement, the collective the codec declares (the payloads summed, or gathered), the decode
//! of the sum, error feedback's reconstruction of this rank's own share, and a stateful codec's
//! next state. The collectives are a [`Mover`]'s: MPI's world in the trainer
//! (`crates/train/src/exchange/codec.rs`), [`SingleRank`] for `compare`, `trace` and
//! `bench codecs`, `torch.distributed` in `lsgd-torch`. So this crate still builds without MPI
//! and libtorch, and a change to the exchange is made and tested here.
//!
//! - `sum(element)`: each round's payloads are all-reduced as vectors of `element`; round r+1
//!   encodes with the sums of rounds ≤ r; the sums are decoded once.
//! - `gather`: every rank's payload is gathered, each decoded, and the floats added in rank
//!   order, so every rank adds the same numbers in the same order.
//!
//! Before each round's collective the ranks agree on every payload's length, and on whether a
//! codec failed anywhere, so that a codec that misbehaves on one rank stops every rank with an
//! error instead of leaving the others waiting in the collective.

use lsgd_codec::{Combine, DynCodec, Element, Meta, Properties};

use crate::plugin::{Plugin, PluginError};

/// The calls of a codec an exchange makes (a sandboxed [`Plugin`] or a [`Native`] codec).
pub trait BucketCodec {
    /// A failed call.
    type Error;
    /// `encode` of one round: this rank's payload; `agreed` holds the earlier rounds' sums.
    fn encode(
        &mut self,
        meta: &Meta,
        data: &[f32],
        agreed: &[Vec<u8>],
    ) -> Result<Vec<u8>, Self::Error>;
    /// `decode` of the summed payloads of every round, or of one rank's gathered payload.
    fn decode(&mut self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, Self::Error>;
    /// A stateful codec's state for the next step, from what every rank received.
    fn next_state(&mut self, meta: &Meta, agreed: &[Vec<u8>]) -> Result<Vec<u8>, Self::Error>;
}

impl BucketCodec for Plugin {
    type Error = PluginError;
    fn encode(
        &mut self,
        meta: &Meta,
        data: &[f32],
        agreed: &[Vec<u8>],
    ) -> Result<Vec<u8>, PluginError> {
        Plugin::encode(self, meta, data, agreed)
    }
    fn decode(&mut self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, PluginError> {
        Plugin::decode(self, meta, payloads)
    }
    fn next_state(&mut self, meta: &Meta, agreed: &[Vec<u8>]) -> Result<Vec<u8>, PluginError> {
        Plugin::next_state(self, meta, agreed)
    }
}

/// A codec compiled into the host (`lsgd_codec::native`), whose errors name it and whose
/// decode is held to the bucket's length as a plugin's is.
pub struct Native<'a>(pub &'a dyn DynCodec);

impl Native<'_> {
    fn fail(&self, message: String) -> crate::Error {
        crate::Error::Native {
            name: self.0.info().name,
            message,
        }
    }
}

impl BucketCodec for Native<'_> {
    type Error = crate::Error;
    fn encode(
        &mut self,
        meta: &Meta,
        data: &[f32],
        agreed: &[Vec<u8>],
    ) -> Result<Vec<u8>, crate::Error> {
        self.0.encode(meta, data, agreed).map_err(|m| self.fail(m))
    }
    fn decode(&mut self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, crate::Error> {
        let out = self.0.decode(meta, payloads).map_err(|m| self.fail(m))?;
        if out.len() != meta.len as usize {
            return Err(self.fail(format!(
                "decode returned {} floats for a bucket of {}",
                out.len(),
                meta.len
            )));
        }
        Ok(out)
    }
    fn next_state(&mut self, meta: &Meta, agreed: &[Vec<u8>]) -> Result<Vec<u8>, crate::Error> {
        self.0.next_state(meta, agreed).map_err(|m| self.fail(m))
    }
}

/// Every rank's payload length for a round, or the lowest rank whose codec failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lengths {
    /// No rank failed: every rank's length, in rank order.
    Agreed(Vec<u64>),
    /// Some rank's codec failed (this one's too, possibly); `rank` is the lowest that did.
    Failed {
        /// The lowest rank that failed.
        rank: usize,
    },
}

/// The collectives of an exchange, among the ranks that exchange a bucket.
pub trait Mover {
    /// A failed collective.
    type Error;
    /// This rank.
    fn rank(&self) -> usize;
    /// How many ranks exchange.
    fn size(&self) -> usize;
    /// Every rank's payload length (`None`: this rank's codec failed), gathered.
    fn agree_lengths(&mut self, mine: Option<u64>) -> Result<Lengths, Self::Error>;
    /// The element-wise sum over ranks of `payload`, a vector of `element`s of the same length
    /// on every rank.
    fn sum(&mut self, element: Element, payload: &[u8]) -> Result<Vec<u8>, Self::Error>;
    /// Every rank's `payload`, in rank order.
    fn gather(&mut self, payload: &[u8]) -> Result<Vec<Vec<u8>>, Self::Error>;
}

/// One rank alone: its payload is the sum and the gather. A round trip decode(encode(data)),
/// each round's own payload standing in for the combined one.
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleRank;

impl Mover for SingleRank {
    type Error = std::convert::Infallible;
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn agree_lengths(&mut self, mine: Option<u64>) -> Result<Lengths, Self::Error> {
        Ok(match mine {
            Some(len) => Lengths::Agreed(vec![len]),
            None => Lengths::Failed { rank: 0 },
        })
    }
    fn sum(&mut self, _element: Element, payload: &[u8]) -> Result<Vec<u8>, Self::Error> {
        Ok(payload.to_vec())
    }
    fn gather(&mut self, payload: &[u8]) -> Result<Vec<Vec<u8>>, Self::Error> {
        Ok(vec![payload.to_vec()])
    }
}

/// What this rank reconstructs of its own contribution, for error feedback's residual.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Own {
    /// Nothing (no error feedback).
    Skip,
    /// The decode of its own payload (GRACE: e ← p − D(own)); for a summable codec, of the
    /// earlier rounds' sums and its own last payload, what the others make of its share.
    Decode,
    /// The sum over ranks divided by their number (PyTorch's e ← p − D(Σ)/k).
    Mean,
}

/// How one bucket's exchange is to run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// The codec's properties (checked by [`crate::codec::check_properties`]).
    pub properties: Properties,
    /// Error feedback's reconstruction.
    pub own: Own,
    /// Whether this rank already failed (a decode fault of an earlier bucket): it encodes
    /// nothing and tells the others at the first agreement.
    pub failed: bool,
}

/// One bucket exchanged on this rank; `E`, the codec's error.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchanged<E> {
    /// This rank's payload of each round.
    pub payloads: Vec<Vec<u8>>,
    /// What the decode needs and a stateful codec's `next-state` takes: the sum of each round
    /// (summable), or every rank's payload in rank order (gathered).
    pub received: Vec<Vec<u8>>,
    /// The decoded sum over ranks, or the fault of its decode or next state (after every
    /// collective of the bucket: the caller tells the others at the next agreement).
    pub decoded: Result<Decoded, E>,
}

/// The floats an exchange decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The sum over ranks.
    pub sum: Vec<f32>,
    /// This rank's own reconstruction ([`Own`]; empty for [`Own::Skip`]).
    pub own: Vec<f32>,
    /// A stateful codec's state for the next step.
    pub next: Option<Vec<u8>>,
}

/// Why a bucket's exchange stopped every rank.
#[derive(Debug)]
pub enum Stop<M, C> {
    /// A collective failed.
    Move(M),
    /// A codec failed on `rank` (the lowest that did) in `round`; `here` is this rank's own
    /// encode fault, when it failed in this round.
    Codec {
        /// The lowest rank that failed.
        rank: usize,
        /// The round.
        round: u32,
        /// This rank's fault in this round's encode.
        here: Option<C>,
    },
    /// A summable codec's payloads differ in length between ranks, or do not hold whole
    /// elements.
    Lengths {
        /// The round.
        round: u32,
        /// Every rank's length.
        lengths: Vec<u64>,
        /// The element type they should hold.
        element: Element,
    },
}

/// What [`exchange`] returns: the bucket exchanged, or why every rank stopped.
pub type Outcome<C, M> = Result<
    Exchanged<<C as BucketCodec>::Error>,
    Stop<<M as Mover>::Error, <C as BucketCodec>::Error>,
>;

/// Exchanges one bucket, `data` with `meta` (round 0, the bucket's codec state in it), through
/// `codec` over `mover`, as `plan` says: [`rounds`], then [`decode`].
pub fn exchange<C: BucketCodec, M: Mover>(
    codec: &mut C,
    mover: &mut M,
    meta: &Meta,
    data: &[f32],
    plan: Plan,
) -> Outcome<C, M> {
    let moved = rounds(codec, mover, meta, data, plan)?;
    let decoded = decode(codec, meta, &moved, plan, mover.rank(), mover.size());
    Ok(Exchanged {
        payloads: moved.payloads,
        received: moved.received,
        decoded,
    })
}

/// What the rounds of one bucket moved on this rank.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Moved {
    /// This rank's payload of each round.
    pub payloads: Vec<Vec<u8>>,
    /// The sum of each round (summable), or every rank's payload in rank order (gathered).
    pub received: Vec<Vec<u8>>,
}

/// The first half of [`exchange`]: every round's encode, length agreement and collective.
pub fn rounds<C: BucketCodec, M: Mover>(
    codec: &mut C,
    mover: &mut M,
    meta: &Meta,
    data: &[f32],
    plan: Plan,
) -> Result<Moved, Stop<M::Error, C::Error>> {
    let rounds = plan.properties.rounds.max(1);
    let mut m = meta.clone();
    let mut moved = Moved::default();
    for round in 0..rounds {
        m.round = round;
        let mine = match plan.failed {
            true => Err(None),
            false => codec.encode(&m, data, &moved.received).map_err(Some),
        };
        let lengths = mover
            .agree_lengths(mine.as_ref().ok().map(|p| p.len() as u64))
            .map_err(Stop::Move)?;
        let lengths = match lengths {
            Lengths::Agreed(l) => l,
            Lengths::Failed { rank } => {
                let here = mine.err().flatten();
                return Err(Stop::Codec { rank, round, here });
            }
        };
        let Ok(mine) = mine else {
            unreachable!("a rank whose encode failed agreed a length")
        };
        match plan.properties.combine {
            Combine::Sum(element) => {
                if lengths.iter().any(|l| *l != lengths[0])
                    || !(lengths[0] as usize).is_multiple_of(element.size())
                {
                    return Err(Stop::Lengths {
                        round,
                        lengths,
                        element,
                    });
                }
                moved
                    .received
                    .push(mover.sum(element, &mine).map_err(Stop::Move)?);
            }
            Combine::Gather => moved.received = mover.gather(&mine).map_err(Stop::Move)?,
        }
        moved.payloads.push(mine);
    }
    Ok(moved)
}

/// The second half of [`exchange`], after every collective of the bucket: the sum over the
/// `ranks` of what the rounds `moved`, this rank's (`rank`'s) own reconstruction, and a
/// stateful codec's next state. `meta` is the bucket's (any round: the decode sees the last).
pub fn decode<C: BucketCodec>(
    codec: &mut C,
    meta: &Meta,
    moved: &Moved,
    plan: Plan,
    rank: usize,
    ranks: usize,
) -> Result<Decoded, C::Error> {
    let m = &Meta {
        round: plan.properties.rounds.max(1) - 1,
        ..meta.clone()
    };
    let (payloads, received) = (&moved.payloads, &moved.received);
    let (sum, mut own) = match plan.properties.combine {
        Combine::Sum(_) => {
            let sum = codec.decode(m, received)?;
            let own = match plan.own {
                Own::Decode => {
                    let mut mine = received[..received.len() - 1].to_vec();
                    mine.push(payloads.last().cloned().unwrap_or_default());
                    codec.decode(m, &mine)?
                }
                Own::Skip | Own::Mean => Vec::new(),
            };
            (sum, own)
        }
        Combine::Gather => {
            let mut sum = vec![0.0f32; m.len as usize];
            let mut own = Vec::new();
            for (r, p) in received.iter().enumerate() {
                let v = codec.decode(m, std::slice::from_ref(p))?;
                for (s, x) in sum.iter_mut().zip(&v) {
                    *s += x;
                }
                if r == rank && plan.own == Own::Decode {
                    own = v;
                }
            }
            (sum, own)
        }
    };
    if plan.own == Own::Mean {
        let k = ranks as f32;
        own = sum.iter().map(|x| x / k).collect();
    }
    let next = match plan.properties.stateful {
        true => Some(codec.next_state(m, received)?),
        false => None,
    };
    Ok(Decoded { sum, own, next })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier, Mutex};

    use super::*;
    use crate::codec::sample_bucket;

    /// Ranks as threads of one test: each collective posts this rank's bytes, waits for all,
    /// and reads everyone's.
    struct Threads {
        rank: usize,
        size: usize,
        board: Arc<(Barrier, Mutex<Vec<Vec<u8>>>)>,
    }

    impl Threads {
        fn all(&mut self, mine: &[u8]) -> Vec<Vec<u8>> {
            let (barrier, board) = &*self.board;
            board.lock().unwrap()[self.rank] = mine.to_vec();
            barrier.wait();
            let all = board.lock().unwrap().clone();
            barrier.wait();
            all
        }
    }

    impl Mover for Threads {
        type Error = std::convert::Infallible;
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.size
        }
        fn agree_lengths(&mut self, mine: Option<u64>) -> Result<Lengths, Self::Error> {
            let all = self.all(&mine.unwrap_or(u64::MAX).to_le_bytes());
            let lens: Vec<u64> = all
                .iter()
                .map(|b| u64::from_le_bytes(b[..8].try_into().unwrap()))
                .collect();
            Ok(match lens.iter().position(|&l| l == u64::MAX) {
                Some(rank) => Lengths::Failed { rank },
                None => Lengths::Agreed(lens),
            })
        }
        fn sum(&mut self, element: Element, payload: &[u8]) -> Result<Vec<u8>, Self::Error> {
            assert_eq!(
                element,
                Element::F32,
                "the tests sum binary32 payloads only"
            );
            let all = self.all(payload);
            let mut sum = vec![0.0f32; payload.len() / 4];
            for p in &all {
                for (s, c) in sum.iter_mut().zip(p.chunks_exact(4)) {
                    *s += f32::from_le_bytes(c.try_into().unwrap());
                }
            }
            Ok(sum.iter().flat_map(|x| x.to_le_bytes()).collect())
        }
        fn gather(&mut self, payload: &[u8]) -> Result<Vec<Vec<u8>>, Self::Error> {
            Ok(self.all(payload))
        }
    }

    /// Runs `f` on `size` ranks as threads, each with its mover; their results in rank order.
    fn on_ranks<T: Send + 'static>(
        size: usize,
        f: impl Fn(&mut Threads) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let board = Arc::new((Barrier::new(size), Mutex::new(vec![Vec::new(); size])));
        let f = Arc::new(f);
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let (board, f) = (board.clone(), f.clone());
                std::thread::spawn(move || f(&mut Threads { rank, size, board }))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    fn codec(name: &str) -> Box<dyn DynCodec> {
        lsgd_codec::native(name, vec![]).unwrap().unwrap()
    }

    fn plan(codec: &dyn DynCodec, own: Own) -> Plan {
        Plan {
            properties: codec.properties(),
            own,
            failed: false,
        }
    }

    #[test]
    fn a_single_rank_is_the_codecs_own_round_trip() {
        let (meta, data) = sample_bucket(16, 8, 2, 7);
        for name in lsgd_codec::NAMES {
            let c = codec(name);
            let done = exchange(
                &mut Native(c.as_ref()),
                &mut SingleRank,
                &meta,
                &data,
                plan(c.as_ref(), Own::Decode),
            )
            .unwrap();
            let (payloads, out) = lsgd_codec::round_trip(c.as_ref(), &meta, &data).unwrap();
            let decoded = done.decoded.unwrap();
            assert_eq!((&done.payloads, &decoded.sum), (&payloads, &out), "{name}");
            // Alone, a rank's own share is the whole sum.
            assert_eq!(decoded.own, decoded.sum, "{name}");
        }
    }

    #[test]
    fn ranks_get_the_same_sum_and_their_own_share() {
        // identity sums f32 payloads; top-k is gathered and decoded in rank order.
        for name in ["identity", "top-k"] {
            let results = on_ranks(3, move |mover| {
                let (meta, data) = sample_bucket(16, 8, 1, 10 + mover.rank as u64);
                let c = codec(name);
                let done = exchange(
                    &mut Native(c.as_ref()),
                    mover,
                    &meta,
                    &data,
                    plan(c.as_ref(), Own::Decode),
                );
                let d = done.unwrap().decoded.unwrap();
                let alone = lsgd_codec::round_trip(c.as_ref(), &meta, &data).unwrap().1;
                (d, alone)
            });
            let sum: Vec<f32> = (0..results[0].0.sum.len())
                .map(|i| results.iter().fold(0.0, |s, (_, alone)| s + alone[i]))
                .collect();
            for (rank, (d, alone)) in results.iter().enumerate() {
                assert_eq!(d.sum, sum, "{name}: rank {rank}'s sum");
                assert_eq!(&d.own, alone, "{name}: rank {rank}'s own share");
            }
        }
    }

    #[test]
    fn mean_feedback_takes_the_sum_over_the_ranks() {
        let results = on_ranks(2, |mover| {
            let (meta, data) = sample_bucket(4, 4, 0, mover.rank as u64);
            let c = codec("identity");
            let plan = plan(c.as_ref(), Own::Mean);
            exchange(&mut Native(c.as_ref()), mover, &meta, &data, plan)
                .unwrap()
                .decoded
                .unwrap()
        });
        for d in results {
            let mean: Vec<f32> = d.sum.iter().map(|x| x / 2.0).collect();
            assert_eq!(d.own, mean);
        }
    }

    #[test]
    fn a_rank_that_failed_stops_every_rank_with_its_number() {
        let results = on_ranks(3, |mover| {
            let (meta, data) = sample_bucket(4, 4, 0, 1);
            let c = codec("identity");
            let plan = Plan {
                failed: mover.rank == 1,
                ..plan(c.as_ref(), Own::Skip)
            };
            match exchange(&mut Native(c.as_ref()), mover, &meta, &data, plan) {
                Err(Stop::Codec { rank, round, here }) => (rank, round, here.is_some()),
                other => panic!("not stopped: {:?}", other.map(|d| d.payloads)),
            }
        });
        assert_eq!(results, vec![(1, 0, false); 3]);
    }
}
