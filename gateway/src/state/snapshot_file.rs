//! Snapshot files: atomic, checksummed, two generations, one writer at a time.
//!
//! A snapshot is one file, `snapshot.json`: a header line `prewarm-snapshot 1 <bytes> <sha256>`
//! then the JSON payload, so truncation and corruption are detected before parsing. Writing
//! streams the payload into `snapshot.json.tmp` through the checksum (the header's length is
//! zero-padded to a fixed width and filled in once the payload is written; fsync), the current
//! file becomes `snapshot.prev.json` — unless its checksum fails, then it is set aside —, the
//! temporary file is renamed over `snapshot.json`, and the directory is fsynced. A previous
//! generation whose checksum fails is set aside too before the rotation would replace it.
//! Writes (periodic, on demand, at shutdown) are serialised by one process-wide lock, which also
//! covers taking the value written, so a later state is never overwritten by an earlier one.
//! Loading takes the current generation, or the previous one when the current is missing,
//! truncated or corrupt, and names every file it could not use ([`Loaded::unusable`]).
//!
//! Invariant: a generation that could not be used is never overwritten or deleted. [`set_aside`]
//! renames it to `<file>.unusable-<unix ms>` (a new name each time, never reused), out of the
//! rotation, for a post-mortem or a manual restore.

use std::io::{BufRead, BufReader, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::registry::manifest::hex;

const MAGIC: &str = "prewarm-snapshot 1";
pub const CURRENT: &str = "snapshot.json";
pub const PREVIOUS: &str = "snapshot.prev.json";
const TEMPORARY: &str = "snapshot.json.tmp";
/// What [`set_aside`] appends to an unusable generation's file name (then the time, unix ms).
pub const UNUSABLE: &str = ".unusable-";
/// Most names [`set_aside`] tries within one millisecond.
const MAX_ASIDE_TRIES: u32 = 1000;
/// Digits of the header's payload length (zero-padded, so the header's size is known before the
/// payload is written).
const LENGTH_DIGITS: usize = 20;

/// One snapshot write at a time in this process.
static WRITES: Mutex<()> = Mutex::new(());
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
    /// The files that exist but could not be used, newest generation first.
    pub unusable: Vec<PathBuf>,
}

/// Renames the unusable generation at `path` to a name no other file has
/// (`<file>.unusable-<unix ms>[-n]`, beside it) and returns that name: it leaves the rotation and
/// is never overwritten.
pub fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| CURRENT.to_string());
    for n in 0..MAX_ASIDE_TRIES {
        let suffix = if n == 0 {
            String::new()
        } else {
            format!("-{n}")
        };
        let aside = path.with_file_name(format!("{name}{UNUSABLE}{now_ms}{suffix}"));
        if !aside.exists() {
            std::fs::rename(path, &aside)?;
            return Ok(aside);
        }
    }
    Err(std::io::Error::other(format!(
        "{}: no free name to set it aside",
        path.display()
    )))
}

/// Writes `value` as the new current generation; the old current becomes the previous one.
pub fn write<T: Serialize>(dir: &Path, value: &T) -> std::io::Result<u64> {
    write_with(dir, || value)
}

/// Takes the value from `make` and writes it, both under the write lock.
pub fn write_with<T: Serialize>(dir: &Path, make: impl FnOnce() -> T) -> std::io::Result<u64> {
    let _one_writer = WRITES.lock().unwrap_or_else(|p| p.into_inner());
    let value = make();
    write_locked(dir, &value)
}

/// Counts and hashes what passes through to the file.
struct Checksummed<W> {
    inner: W,
    sha: Sha256,
    len: u64,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        let written = buf.get(..n).unwrap_or(buf);
        self.sha.update(written);
        self.len = self.len.saturating_add(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn header(len: u64, sum: &str) -> String {
    format!("{MAGIC} {len:0width$} {sum}\n", width = LENGTH_DIGITS)
}

fn write_locked<T: Serialize>(dir: &Path, value: &T) -> std::io::Result<u64> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(TEMPORARY);
    let placeholder = header(0, &"0".repeat(64));
    let len = {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(placeholder.as_bytes())?;
        let (len, sum) = {
            let mut out = Checksummed {
                inner: std::io::BufWriter::new(&mut f),
                sha: Sha256::new(),
                len: 0,
            };
            serde_json::to_writer(&mut out, value).map_err(std::io::Error::other)?;
            out.flush()?;
            (out.len, hex(&out.sha.finalize()))
        };
        let real = header(len, &sum);
        if real.len() != placeholder.len() {
            return Err(std::io::Error::other("snapshot header changed size"));
        }
        f.seek(std::io::SeekFrom::Start(0))?;
        f.write_all(real.as_bytes())?;
        f.sync_all()?;
        len
    };
    let current = dir.join(CURRENT);
    if current.exists() {
        if checksum_ok(&current) {
            let previous = dir.join(PREVIOUS);
            if previous.exists() && !checksum_ok(&previous) {
                let aside = set_aside(&previous)?;
                tracing::error!(file = %aside.display(), "snapshot: the previous generation is corrupt: set aside");
            }
            std::fs::rename(&current, previous)?;
        } else {
            let aside = set_aside(&current)?;
            tracing::error!(file = %aside.display(), "snapshot: the current generation is corrupt: set aside, the previous one kept");
        }
    }
    std::fs::rename(&tmp, &current)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(placeholder.len() as u64 + len)
}

/// The payload length and checksum a header line announces.
fn parse_header(line: &[u8]) -> Result<(usize, &str), &'static str> {
    let header = std::str::from_utf8(line).map_err(|_| "header is not text")?;
    let rest = header
        .strip_prefix(MAGIC)
        .ok_or("not a prewarm snapshot (version 1)")?;
    let mut fields = rest.split_whitespace();
    let len: usize = fields
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or("header: bad length")?;
    let sum = fields.next().ok_or("header: no checksum")?;
    Ok((len, sum))
}

/// Whether the file at `path` has its header's length and checksum (streamed: the payload is
/// not held in memory).
fn checksum_ok(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    if reader
        .by_ref()
        .take(4096)
        .read_until(b'\n', &mut line)
        .is_err()
    {
        return false;
    }
    let Some(line) = line.strip_suffix(b"\n") else {
        return false;
    };
    let Ok((len, sum)) = parse_header(line) else {
        return false;
    };
    let mut sha = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0usize;
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                sha.update(buf.get(..n).unwrap_or(&[]));
                total = total.saturating_add(n);
            }
            Err(_) => return false,
        }
    }
    total == len && hex(&sha.finalize()) == sum
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
    let (len, sum) = parse_header(bytes.get(..newline).unwrap_or(&[])).map_err(bad)?;
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
    let mut unusable = Vec::new();
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
                    unusable,
                }
            }
            Ok(None) => {}
            Err(p) => {
                problems.push(p);
                unusable.push(path);
            }
        }
    }
    Loaded {
        value: None,
        generation: Generation::None,
        problems,
        unusable,
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

    /// Sixteen writers at once (periodic, on demand, shutdown): each write completes in turn, the
    /// current generation is whole, and no temporary file is left.
    #[test]
    fn parallel_writes_are_serialised() {
        let dir = tempfile::tempdir().unwrap();
        let values: Vec<Vec<u32>> = (0..16u32).map(|i| vec![i; 20_000]).collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = values
                .iter()
                .map(|v| s.spawn(|| write(dir.path(), v)))
                .collect();
            for h in handles {
                assert!(h.join().unwrap().is_ok());
            }
        });
        let l: Loaded<Vec<u32>> = load(dir.path());
        assert_eq!(l.generation, Generation::Current, "{:?}", l.problems);
        assert!(values.contains(&l.value.unwrap()));
        assert!(checksum_ok(&dir.path().join(PREVIOUS)));
        assert!(!dir.path().join(TEMPORARY).exists());
    }

    /// The files set aside in `dir`, with their bytes, by name.
    fn aside(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut found: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(UNUSABLE))
            .map(|p| {
                let bytes = std::fs::read(&p).unwrap();
                (p.file_name().unwrap().to_string_lossy().into_owned(), bytes)
            })
            .collect();
        found.sort();
        found
    }

    fn corrupt(path: &Path) -> Vec<u8> {
        let mut bytes = std::fs::read(path).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 1;
        std::fs::write(path, &bytes).unwrap();
        bytes
    }

    /// A corrupt current generation is set aside, never rotated over the good previous one.
    #[test]
    fn a_corrupt_current_is_set_aside_and_the_previous_survives() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &vec![1u32]).unwrap();
        write(dir.path(), &vec![2u32]).unwrap();
        let bytes = corrupt(&dir.path().join(CURRENT));
        // What a restart loads: the previous generation, naming the current as unusable.
        let l: Loaded<Vec<u32>> = load(dir.path());
        assert_eq!(
            (l.value, l.generation),
            (Some(vec![1]), Generation::Previous)
        );
        assert_eq!(l.unusable, vec![dir.path().join(CURRENT)]);
        write(dir.path(), &vec![3u32]).unwrap();
        let aside = aside(dir.path());
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert!(aside[0].0.starts_with("snapshot.json.unusable-"));
        assert_eq!(aside[0].1, bytes);
        let prev = read_one::<Vec<u32>>(&dir.path().join(PREVIOUS)).unwrap();
        assert_eq!(prev, Some(vec![1]), "the good previous generation survived");
        let l: Loaded<Vec<u32>> = load(dir.path());
        assert_eq!(
            (l.value, l.generation),
            (Some(vec![3]), Generation::Current)
        );
    }

    /// A corrupt previous generation is set aside before a rotation would replace it, and
    /// neither it nor any earlier one set aside is touched by the writes after.
    #[test]
    fn no_write_overwrites_an_unusable_generation() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &vec![1u32]).unwrap();
        write(dir.path(), &vec![2u32]).unwrap();
        let bad_previous = corrupt(&dir.path().join(PREVIOUS));
        write(dir.path(), &vec![3u32]).unwrap();
        let bad_current = corrupt(&dir.path().join(CURRENT));
        for i in 4..10u32 {
            write(dir.path(), &vec![i]).unwrap();
        }
        let kept: Vec<Vec<u8>> = aside(dir.path()).into_iter().map(|(_, b)| b).collect();
        assert_eq!(kept.len(), 2, "both unusable generations kept");
        assert!(kept.contains(&bad_previous) && kept.contains(&bad_current));
        let l: Loaded<Vec<u32>> = load(dir.path());
        assert_eq!(
            (l.value, l.generation),
            (Some(vec![9]), Generation::Current)
        );
    }

    #[test]
    fn set_aside_never_reuses_a_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut names = Vec::new();
        for i in 0..5u8 {
            let path = dir.path().join(CURRENT);
            std::fs::write(&path, [i]).unwrap();
            names.push(set_aside(&path).unwrap());
        }
        let kept = aside(dir.path());
        assert_eq!(kept.len(), 5, "{names:?}");
        assert_eq!(
            kept.iter()
                .map(|(_, b)| b[0])
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            5
        );
        assert!(!dir.path().join(CURRENT).exists());
    }

    #[test]
    fn load_names_every_generation_it_could_not_use() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &vec![1u32]).unwrap();
        write(dir.path(), &vec![2u32]).unwrap();
        corrupt(&dir.path().join(CURRENT));
        std::fs::write(dir.path().join(PREVIOUS), b"garbage").unwrap();
        let l: Loaded<Vec<u32>> = load(dir.path());
        assert_eq!((l.value, l.generation), (None, Generation::None));
        assert_eq!(
            l.unusable,
            vec![dir.path().join(CURRENT), dir.path().join(PREVIOUS)]
        );
        // A payload that is whole but not a snapshot of this shape is unusable too.
        write(dir.path(), &"not a list").unwrap();
        let l: Loaded<Vec<u32>> = load(dir.path());
        assert_eq!(l.generation, Generation::None);
        assert_eq!(l.unusable.len(), 2, "{:?}", l.problems);
    }

    #[test]
    fn the_header_is_written_after_the_streamed_payload() {
        let dir = tempfile::tempdir().unwrap();
        let n = write(dir.path(), &"x".repeat(1000)).unwrap();
        let bytes = std::fs::read(dir.path().join(CURRENT)).unwrap();
        assert_eq!(n, bytes.len() as u64);
        let line = bytes.split(|b| *b == b'\n').next().unwrap();
        let (len, sum) = parse_header(line).unwrap();
        assert_eq!(len, 1002);
        assert_ne!(sum, "0".repeat(64));
        assert!(checksum_ok(&dir.path().join(CURRENT)));
    }
}
