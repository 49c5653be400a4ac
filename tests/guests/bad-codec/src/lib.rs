//! Test guest: the identity codec until `from_step`, then the misbehaviour `mode` asks for, so
//! the host's codec checks (decode length, malformed payloads, traps, summable payloads of
//! different lengths on different ranks) and its checkpoint-on-fault can be tested end to end.

wit_bindgen::generate!({ path: "../../../wit/v0.2.0", world: "codec-plugin" });

use lsgd_codec::identity::Identity;
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
}

struct BadCodec {
    mode: Mode,
    from_step: u64,
}

impl BadCodec {
    fn misbehaves(&self, meta: &Meta) -> bool {
        meta.step >= self.from_step
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
                    &["ok", "trap", "refuse", "short", "uneven", "rounds"],
                    "ok (identity); trap (panic in encode); refuse (decode returns an error); \
                     short (decode returns one float too few); uneven (a summable payload longer \
                     on odd ranks, told apart by rank_seed parity); rounds (declares 2 rounds \
                     with gather, which the host refuses)",
                ),
                ParamSpec::integer("from_step", 0, "misbehave from this step on"),
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
            _ => Mode::Rounds,
        };
        let from_step = u64::try_from(p.integer("from_step")?)
            .map_err(|_| "parameter 'from_step' must be >= 0".to_string())?;
        Ok(BadCodec { mode, from_step })
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
                _ => {}
            }
        }
        Ok(out)
    }
}

lsgd_codec::export_codec!(BadCodec);
