//! Test guest: the identity codec until `from_step`, then the misbehaviour `mode` asks for, so
//! the host's codec checks (decode length, malformed payloads, traps, summable payloads of
//! different lengths on different ranks) and its checkpoint-on-fault can be tested end to end.

wit_bindgen::generate!({ path: "../../../wit/v0.2.0", world: "codec-plugin" });

use lsgd_codec::identity::Identity;
use lsgd_codec::rng::mix;
use lsgd_codec::{Codec, Info, Meta, ParamSpec, Params, Policy, Properties};

/// What the codec does from `from_step` on.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Ok,
    Trap,
    Refuse,
    Short,
    Uneven,
    Rounds,
    Loop,
    Slow,
    HugeDecode,
    HugeEncode,
}

struct BadCodec {
    mode: Mode,
    from_step: u64,
    /// Misbehave only on this rank (`None`: on every rank).
    on_rank: Option<u64>,
    /// Iterations of busy work per encode in `slow` mode.
    spin: u64,
}

impl BadCodec {
    fn misbehaves(&self, meta: &Meta) -> bool {
        meta.step >= self.from_step && self.on_rank.is_none_or(|r| rank_of(meta) == Some(r))
    }
}

/// The rank this call runs on, recovered from the host's seed mixing
/// (`rank_seed = mix(shared_seed ^ mix(rank + 1))`): a test guest may know what a codec must
/// not rely on, so that a fault can strike one rank only.
fn rank_of(meta: &Meta) -> Option<u64> {
    (0..4096).find(|r| mix(meta.shared_seed ^ mix(r + 1)) == meta.rank_seed)
}

/// Never returns; black_box keeps the optimiser from proving the loop side-effect free.
fn spin_forever() -> ! {
    let mut n = 0u64;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

impl Policy for BadCodec {
    fn info() -> Info {
        Info::new(
            "bad-codec",
            "Test guest: identity, or traps, refuses, decodes short, sends uneven payloads",
            vec![
                ParamSpec::choice(
                    "mode",
                    &[
                        "ok",
                        "trap",
                        "refuse",
                        "short",
                        "uneven",
                        "rounds",
                        "loop",
                        "slow",
                        "huge-decode",
                        "huge-encode",
                    ],
                    "ok (identity); trap (panic in encode); refuse (decode returns an error); \
                     short (decode returns one float too few); uneven (a summable payload longer \
                     on odd ranks, told apart by rank_seed parity); rounds (declares 2 rounds \
                     with gather, which the host refuses); loop (encode never returns); slow \
                     (encode does `spin` iterations of busy work first); huge-decode (decode \
                     returns 4M floats whatever the bucket); huge-encode (a payload 64 times the \
                     bucket's bytes)",
                ),
                ParamSpec::integer("from_step", 0, "misbehave from this step on"),
                ParamSpec::integer(
                    "on_rank",
                    -1,
                    "misbehave only on this rank (-1: on every rank)",
                ),
                ParamSpec::integer("spin", 10_000_000, "busy-work iterations of `slow`"),
            ],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let mode = match p.text("mode")? {
            "ok" => Mode::Ok,
            "trap" => Mode::Trap,
            "refuse" => Mode::Refuse,
            "short" => Mode::Short,
            "uneven" => Mode::Uneven,
            "loop" => Mode::Loop,
            "slow" => Mode::Slow,
            "huge-decode" => Mode::HugeDecode,
            "huge-encode" => Mode::HugeEncode,
            _ => Mode::Rounds,
        };
        let from_step = u64::try_from(p.integer("from_step")?)
            .map_err(|_| "parameter 'from_step' must be >= 0".to_string())?;
        let on_rank = u64::try_from(p.integer("on_rank")?).ok();
        let spin = u64::try_from(p.integer("spin")?)
            .map_err(|_| "parameter 'spin' must be >= 0".to_string())?;
        Ok(BadCodec {
            mode,
            from_step,
            on_rank,
            spin,
        })
    }
}

impl Codec for BadCodec {
    fn properties(&self) -> Properties {
        match self.mode {
            Mode::Rounds => Properties {
                rounds: 2,
                ..Properties::GATHER
            },
            _ => Identity.properties(),
        }
    }

    fn encode(&self, meta: &Meta, data: &[f32], agreed: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        let mut out = Identity.encode(meta, data, agreed)?;
        if self.misbehaves(meta) {
            match self.mode {
                Mode::Trap => panic!("bad-codec: trap at step {}", meta.step),
                Mode::Loop => spin_forever(),
                Mode::Slow => {
                    let mut n = 0u64;
                    for _ in 0..self.spin {
                        n = std::hint::black_box(n.wrapping_add(1));
                    }
                }
                Mode::HugeEncode => out.resize(out.len() * 64 + 64, 0),
                // The host's rank seeds differ per rank; parity splits ranks into two groups.
                Mode::Uneven if meta.rank_seed % 2 == 1 => out.extend_from_slice(&[0; 4]),
                _ => {}
            }
        }
        Ok(out)
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        let mut out = Identity.decode(meta, payloads)?;
        if self.misbehaves(meta) {
            match self.mode {
                Mode::Refuse => return Err("malformed payload: bad-codec refuses".into()),
                Mode::Short => {
                    out.pop();
                }
                Mode::HugeDecode => out.resize(4 << 20, 0.0),
                _ => {}
            }
        }
        Ok(out)
    }
}

lsgd_codec::export_codec!(BadCodec);
