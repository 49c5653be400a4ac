//! TensorBoard event files beside metrics.jsonl (`tensorboard --logdir OUT`): events of
//! scalars, each a list of (tag, value) at a step, and the `SessionLog.START` a resumed run's
//! file opens with. What a metrics record becomes, and at which step, is for
//! [`crate::metrics::Record::scalars`] to say: this module only writes.
//!
//! The format is TensorFlow's: TFRecord framing (length, masked CRC-32C of the length, data,
//! masked CRC-32C of the data) around `tensorboard.Event` protobufs, encoded here by hand
//! since only four messages of it are needed. A resumed run appends a new file that starts
//! with a `SessionLog.START` at the resume step: readers drop what earlier files hold from
//! that step on, as metrics.jsonl drops the records past the checkpoint.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Error, Result};

/// What every event file's name starts with (TensorBoard looks for it).
pub const FILE_PREFIX: &str = "events.out.tfevents.";

/// One event file being written.
pub struct EventWriter {
    path: PathBuf,
    file: BufWriter<File>,
}

impl EventWriter {
    /// Creates `dir/events.out.tfevents.<secs>.<host>.<pid>` and writes its version event.
    /// Readers take a directory's files in name order and a `SessionLog.START` only purges
    /// what came before it, so `<secs>` is past every existing file's even within a second.
    pub fn create(dir: &Path) -> Result<Self> {
        let now = unix_s();
        let newest = event_files(dir)?
            .iter()
            .filter_map(|p| {
                let name = p.file_name()?.to_str()?.strip_prefix(FILE_PREFIX)?;
                name.split('.').next()?.parse::<u64>().ok()
            })
            .max();
        let secs = (now as u64).max(newest.map_or(0, |s| s + 1));
        let path = dir.join(format!(
            "{FILE_PREFIX}{secs}.{}.{}",
            hostname(),
            std::process::id()
        ));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(Error::io(format!("cannot create {}", path.display())))?;
        let mut w = EventWriter {
            path,
            file: BufWriter::new(file),
        };
        let mut event = Vec::new();
        double(&mut event, 1, now);
        bytes(&mut event, 3, b"brain.Event:2");
        w.record(&event)
            .and_then(|()| w.file.flush())
            .map_err(w.error())?;
        Ok(w)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one event holding `values` (tag, value) at `step`.
    pub fn scalars(&mut self, wall_time: f64, step: u64, values: &[(&str, f64)]) -> io::Result<()> {
        let mut summary = Vec::new();
        for (tag, value) in values {
            let mut v = Vec::new();
            bytes(&mut v, 1, tag.as_bytes());
            // Value.simple_value: float, wire type 5.
            key(&mut v, 2, 5);
            v.extend_from_slice(&(*value as f32).to_le_bytes());
            bytes(&mut summary, 1, &v);
        }
        let mut event = Vec::new();
        double(&mut event, 1, wall_time);
        varint_field(&mut event, 2, step);
        bytes(&mut event, 5, &summary);
        self.record(&event)
    }

    /// Appends `SessionLog { status: START }` at `step`: readers discard the events of earlier
    /// files at `step` and later (a resumed run redoes them).
    pub fn session_start(&mut self, step: u64) -> io::Result<()> {
        let mut log = Vec::new();
        varint_field(&mut log, 1, 1);
        let mut event = Vec::new();
        double(&mut event, 1, unix_s());
        varint_field(&mut event, 2, step);
        bytes(&mut event, 7, &log);
        self.record(&event)
    }

    /// Pushes buffered events to disk.
    pub fn flush(&mut self) -> Result<()> {
        self.file.flush().map_err(self.error())
    }

    /// An I/O error in this file.
    pub fn error(&self) -> impl FnOnce(io::Error) -> Error + use<> {
        Error::io(format!("cannot write {}", self.path.display()))
    }

    fn record(&mut self, data: &[u8]) -> io::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        self.file.write_all(&len)?;
        self.file.write_all(&masked_crc(&len).to_le_bytes())?;
        self.file.write_all(data)?;
        self.file.write_all(&masked_crc(data).to_le_bytes())
    }
}

/// Removes the event files in `dir` (a new run starts over, as metrics.jsonl does).
pub fn remove_event_files(dir: &Path) -> Result<()> {
    for path in event_files(dir)? {
        fs::remove_file(&path).map_err(Error::io(format!("cannot remove {}", path.display())))?;
    }
    Ok(())
}

fn event_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("cannot list {}", dir.display()))(e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(Error::io(format!("cannot list {}", dir.display())))?;
        if entry.file_name().to_string_lossy().starts_with(FILE_PREFIX) {
            files.push(entry.path());
        }
    }
    Ok(files)
}

/// Seconds since the Unix epoch now: the wall time of an event written as it happens.
pub fn unix_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer it is given.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(h) if rc == 0 && !h.is_empty() => h.replace('/', "_"),
        _ => "localhost".to_string(),
    }
}

fn key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    varint(out, u64::from(field) << 3 | u64::from(wire_type));
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    key(out, field, 0);
    varint(out, v);
}

fn double(out: &mut Vec<u8>, field: u32, v: f64) {
    key(out, field, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

fn bytes(out: &mut Vec<u8>, field: u32, data: &[u8]) {
    key(out, field, 2);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses.
pub fn crc32c(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    !data.iter().fold(!0u32, |crc, &b| {
        TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8)
    })
}

/// TFRecord's masked CRC: a CRC of data that holds CRCs is itself poorly distributed.
fn masked_crc(data: &[u8]) -> u32 {
    crc32c(data).rotate_right(15).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A protobuf field: (number, varint or fixed value, or bytes).
    #[derive(Debug, PartialEq)]
    enum Field {
        Int(u64),
        Bytes(Vec<u8>),
    }

    fn read_varint(data: &[u8], at: &mut usize) -> u64 {
        let mut v = 0;
        for shift in (0..64).step_by(7) {
            let b = data[*at];
            *at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return v;
            }
        }
        panic!("varint too long");
    }

    fn fields(data: &[u8]) -> Vec<(u64, Field)> {
        let mut at = 0;
        let mut out = Vec::new();
        while at < data.len() {
            let k = read_varint(data, &mut at);
            let f = match k & 7 {
                0 => Field::Int(read_varint(data, &mut at)),
                1 => {
                    at += 8;
                    Field::Int(u64::from_le_bytes(data[at - 8..at].try_into().unwrap()))
                }
                2 => {
                    let n = read_varint(data, &mut at) as usize;
                    at += n;
                    Field::Bytes(data[at - n..at].to_vec())
                }
                5 => {
                    at += 4;
                    Field::Int(u32::from_le_bytes(data[at - 4..at].try_into().unwrap()).into())
                }
                t => panic!("wire type {t}"),
            };
            out.push((k >> 3, f));
        }
        out
    }

    /// The payloads of a TFRecord file, checking both CRCs of every record.
    fn records(file: &[u8]) -> Vec<Vec<u8>> {
        let mut at = 0;
        let mut out = Vec::new();
        while at < file.len() {
            let len = &file[at..at + 8];
            let crc = u32::from_le_bytes(file[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc(len), "length CRC of the record at {at}");
            let n = u64::from_le_bytes(len.try_into().unwrap()) as usize;
            let data = &file[at + 12..at + 12 + n];
            let crc = u32::from_le_bytes(file[at + 12 + n..at + 16 + n].try_into().unwrap());
            assert_eq!(crc, masked_crc(data), "data CRC of the record at {at}");
            out.push(data.to_vec());
            at += 16 + n;
        }
        out
    }

    fn bytes_of(f: &(u64, Field)) -> &[u8] {
        match &f.1 {
            Field::Bytes(b) => b,
            other => panic!("field {} is {other:?}", f.0),
        }
    }

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn events_round_trip_through_the_framing() {
        let dir = std::env::temp_dir().join(format!("lsgd-tensorboard-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let mut w = EventWriter::create(&dir).unwrap();
        let step = [
            ("train/loss", 2.25),
            ("train/lr", 0.1),
            ("train/bytes_sent", f64::from(1 << 20)),
            ("train/policy_s", 0.001),
            ("train/loss_scale", 65536.0),
        ];
        w.scalars(1.5e9, 300, &step).unwrap();
        w.session_start(7).unwrap();
        w.scalars(unix_s(), 301, &[("test/accuracy", 0.875)])
            .unwrap();
        w.flush().unwrap();
        let path = w.path().to_path_buf();
        drop(w);
        // A second file in the same second sorts after the first.
        let second = EventWriter::create(&dir).unwrap().path().to_path_buf();
        assert!(
            second > path,
            "{} sorts before {}",
            second.display(),
            path.display()
        );
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with(FILE_PREFIX), "{name}");
        assert!(
            name.ends_with(&format!(".{}", std::process::id())),
            "{name}"
        );

        let recs = records(&fs::read(&path).unwrap());
        assert_eq!(recs.len(), 4);
        let version = fields(&recs[0]);
        assert_eq!(version[0].0, 1);
        assert_eq!(version[1], (3, Field::Bytes(b"brain.Event:2".to_vec())));

        let event = fields(&recs[1]);
        assert_eq!(event[0], (1, Field::Int(1.5e9f64.to_bits())));
        assert_eq!(event[1], (2, Field::Int(300)));
        assert_eq!(event[2].0, 5);
        let values: Vec<(String, f32)> = fields(bytes_of(&event[2]))
            .iter()
            .map(|v| {
                assert_eq!(v.0, 1);
                let value = fields(bytes_of(v));
                let Field::Int(bits) = value[1].1 else {
                    panic!("{value:?}")
                };
                (
                    String::from_utf8(bytes_of(&value[0]).to_vec()).unwrap(),
                    f32::from_bits(bits as u32),
                )
            })
            .collect();
        // Each value as the f32 TensorBoard keeps.
        assert_eq!(
            values,
            step.iter()
                .map(|(t, v)| (t.to_string(), *v as f32))
                .collect::<Vec<_>>()
        );
        assert!(values.contains(&("train/loss_scale".to_string(), 65536.0)));

        let start = fields(&recs[2]);
        assert_eq!(start[1], (2, Field::Int(7)));
        assert_eq!(start[2], (7, Field::Bytes(vec![0x08, 0x01])));
        assert_eq!(fields(&recs[3])[1], (2, Field::Int(301)));

        // A flipped bit is caught by the data CRC.
        let mut damaged = fs::read(&path).unwrap();
        let at = damaged.len() - 6;
        damaged[at] ^= 1;
        assert!(std::panic::catch_unwind(|| records(&damaged)).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
