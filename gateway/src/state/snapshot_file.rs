//! Snapshot files: atomic, checksummed, two generations.
//!
//! A snapshot is one file, `snapshot.json`: a header line `prewarm-snapshot 1 <bytes> <sha256>`
//! then the JSON payload, so truncation and corruption are detected before parsing. Writing goes
//! to `snapshot.json.tmp` (write, fsync), the current file becomes `snapshot.prev.json`, the
//! temporary file is renamed over `snapshot.json`, and the directory is fsynced. Loading takes the
//! current generation, or the previous one when the current is missing, truncated or corrupt.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::registry::manifest::hex;

const MAGIC: &str = "prewarm-snapshot 1";
pub const CURRENT: &str = "snapshot.json";
pub const PREVIOUS: &str = "snapshot.prev.json";
const TEMPORARY: &str = "snapshot.json.tmp";
/// Largest snapshot read, bytes.
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 30;

/// Which generation a load used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Generation {
    Current,
    /// The current one was unusable (see the load's `problems`).
    Previous,
    /// Neither existed or was usable: a fresh start.
    None,
}

/// The outcome of [`load`].
#[derive(Debug)]
pub struct Loaded<T> {
    pub value: Option<T>,
    pub generation: Generation,
    /// Why a generation was skipped (each names its file).
    pub problems: Vec<String>,
}

/// Writes `value` as the new current generation; the old current becomes the previous one.
pub fn write<T: Serialize>(dir: &Path, value: &T) -> std::io::Result<u64> {
    std::fs::create_dir_all(dir)?;
    let payload = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let header = format!(
        "{MAGIC} {} {}\n",
        payload.len(),
        hex(&Sha256::digest(&payload))
    );
    let tmp = dir.join(TEMPORARY);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(header.as_bytes())?;
        f.write_all(&payload)?;
        f.sync_all()?;
    }
    let current = dir.join(CURRENT);
    if current.exists() {
        std::fs::rename(&current, dir.join(PREVIOUS))?;
    }
    std::fs::rename(&tmp, &current)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok((header.len() + payload.len()) as u64)
}

fn read_one<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, String> {
    let bytes = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
        Ok(m) if m.len() > MAX_SNAPSHOT_BYTES => {
            return Err(format!(
                "{}: larger than {MAX_SNAPSHOT_BYTES} bytes",
                path.display()
            ))
        }
        Ok(_) => std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?,
    };
    let bad = |why: &str| format!("{}: {why}", path.display());
    let newline = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| bad("no header line (truncated?)"))?;
    let header = std::str::from_utf8(bytes.get(..newline).unwrap_or(&[]))
        .map_err(|_| bad("header is not text"))?;
    let rest = header
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("not a prewarm snapshot (version 1)"))?;
    let mut fields = rest.split_whitespace();
    let len: usize = fields
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("header: bad length"))?;
    let sum = fields.next().ok_or_else(|| bad("header: no checksum"))?;
    let payload = bytes.get(newline + 1..).unwrap_or(&[]);
    if payload.len() != len {
        return Err(bad(&format!(
            "truncated: {} of {len} payload bytes",
            payload.len()
        )));
    }
    if hex(&Sha256::digest(payload)) != sum {
        return Err(bad("checksum mismatch (corrupt)"));
    }
    serde_json::from_slice(payload)
        .map(Some)
        .map_err(|e| bad(&format!("payload: {e}")))
}

/// Loads the newest usable generation from `dir`. Never fails: problems are reported.
pub fn load<T: DeserializeOwned>(dir: &Path) -> Loaded<T> {
    let mut problems = Vec::new();
    for (file, generation) in [
        (CURRENT, Generation::Current),
        (PREVIOUS, Generation::Previous),
    ] {
        let path: PathBuf = dir.join(file);
        match read_one(&path) {
            Ok(Some(value)) => {
                return Loaded {
                    value: Some(value),
                    generation: if problems.is_empty() {
                        generation
                    } else {
                        Generation::Previous
                    },
                    problems,
                }
            }
            Ok(None) => {}
            Err(p) => problems.push(p),
        }
    }
    Loaded {
        value: None,
        generation: Generation::None,
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_previous_generation_kept() {
        let dir = tempfile::tempdir().unwrap();
        let l: Loaded<Vec<u32>> = load(dir.path());
        assert_eq!((l.value, l.generation), (None, Generation::None));
        write(dir.path(), &vec![1u32]).unwrap();
        write(dir.path(), &vec![2u32]).unwrap();
        let l: Loaded<Vec<u32>> = load(dir.path());
        assert_eq!(
            (l.value, l.generation),
            (Some(vec![2]), Generation::Current)
        );
        assert!(dir.path().join(PREVIOUS).exists());
        assert!(!dir.path().join(TEMPORARY).exists());
    }

    #[test]
    fn truncated_or_corrupt_falls_back_to_previous() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &vec![1u32, 2, 3]).unwrap();
        write(dir.path(), &vec![4u32, 5, 6]).unwrap();
        let current = dir.path().join(CURRENT);
        let full = std::fs::read(&current).unwrap();
        std::fs::write(&current, &full[..full.len() - 2]).unwrap();
        let l: Loaded<Vec<u32>> = load(dir.path());
        assert_eq!(l.value, Some(vec![1, 2, 3]));
        assert_eq!(l.generation, Generation::Previous);
        assert!(l.problems[0].contains("truncated"), "{:?}", l.problems);
        let mut flipped = full.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 1;
        std::fs::write(&current, &flipped).unwrap();
        let l: Loaded<Vec<u32>> = load(dir.path());
        assert!(l.problems[0].contains("checksum"), "{:?}", l.problems);
        std::fs::write(dir.path().join(PREVIOUS), b"garbage").unwrap();
        let l: Loaded<Vec<u32>> = load(dir.path());
        assert_eq!((l.value, l.generation), (None, Generation::None));
        assert_eq!(l.problems.len(), 2);
    }
}
