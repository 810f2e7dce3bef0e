//! SHA-256 manifests of adapter directories: every regular file under the directory (sorted
//! relative paths, bounded in count), its size and digest, and one digest over the whole list.
//! A load is allowed only when the directory still hashes to the registered manifest.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One file of an adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// Path relative to the adapter directory, `/`-separated.
    pub path: String,
    pub bytes: u64,
    /// Lower-case hex SHA-256 of the contents.
    pub sha256: String,
}

/// The files of an adapter directory and their digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub files: Vec<ManifestFile>,
    /// SHA-256 over `path\0bytes\0sha256\n` of every file in order: equal digests, equal trees.
    pub digest: String,
}

/// Why a directory could not be hashed.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: more than {limit} files")]
    TooManyFiles { path: PathBuf, limit: usize },
    #[error("{path}: no files")]
    Empty { path: PathBuf },
}

/// Where a directory differs from a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ManifestMismatch {
    pub changed: Vec<String>,
    pub missing: Vec<String>,
    pub unexpected: Vec<String>,
}

impl ManifestMismatch {
    pub fn summary(&self) -> String {
        format!(
            "changed {:?}, missing {:?}, unexpected {:?}",
            self.changed, self.missing, self.unexpected
        )
    }
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ManifestError + '_ {
    move |source| ManifestError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn hash_file(path: &Path) -> Result<(u64, String), ManifestError> {
    let mut file = std::fs::File::open(path).map_err(io(path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        hasher.update(buf.get(..n).unwrap_or(&[]));
        total = total.saturating_add(n as u64);
    }
    Ok((total, hex(&hasher.finalize())))
}

fn walk(
    root: &Path,
    dir: &Path,
    limit: usize,
    out: &mut Vec<(String, PathBuf)>,
) -> Result<(), ManifestError> {
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(io(&path))?;
        if kind.is_dir() {
            walk(root, &path, limit, out)?;
        } else if kind.is_file() {
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push((rel, path));
            if out.len() > limit {
                return Err(ManifestError::TooManyFiles {
                    path: root.to_path_buf(),
                    limit,
                });
            }
        }
    }
    Ok(())
}

/// Hashes every regular file under `dir` (at most `limit` files; symlinks are not followed).
pub fn manifest_of(dir: &Path, limit: usize) -> Result<Manifest, ManifestError> {
    let mut found = Vec::new();
    walk(dir, dir, limit, &mut found)?;
    if found.is_empty() {
        return Err(ManifestError::Empty {
            path: dir.to_path_buf(),
        });
    }
    found.sort();
    let mut files = Vec::with_capacity(found.len());
    for (rel, path) in found {
        let (bytes, sha256) = hash_file(&path)?;
        files.push(ManifestFile {
            path: rel,
            bytes,
            sha256,
        });
    }
    Ok(Manifest::from_files(files))
}

impl Manifest {
    /// A manifest of `files` (sorted by path here) with its digest.
    pub fn from_files(mut files: Vec<ManifestFile>) -> Self {
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let mut h = Sha256::new();
        for f in &files {
            h.update(f.path.as_bytes());
            h.update(b"\0");
            h.update(f.bytes.to_string().as_bytes());
            h.update(b"\0");
            h.update(f.sha256.as_bytes());
            h.update(b"\n");
        }
        Self {
            digest: hex(&h.finalize()),
            files,
        }
    }

    /// `None` when `actual` has exactly these files and contents.
    pub fn mismatch(&self, actual: &Manifest) -> Option<ManifestMismatch> {
        if self.digest == actual.digest {
            return None;
        }
        let mut m = ManifestMismatch {
            changed: Vec::new(),
            missing: Vec::new(),
            unexpected: Vec::new(),
        };
        for f in &self.files {
            match actual.files.iter().find(|a| a.path == f.path) {
                None => m.missing.push(f.path.clone()),
                Some(a) if a.sha256 != f.sha256 || a.bytes != f.bytes => {
                    m.changed.push(f.path.clone())
                }
                Some(_) => {}
            }
        }
        for a in &actual.files {
            if !self.files.iter().any(|f| f.path == a.path) {
                m.unexpected.push(a.path.clone());
            }
        }
        Some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_follows_content_and_mismatch_names_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("adapter_config.json"), b"{\"r\":8}").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/weights.bin"), b"abc").unwrap();
        let a = manifest_of(dir.path(), 10).unwrap();
        assert_eq!(a.files.len(), 2);
        assert_eq!(a.files[1].path, "sub/weights.bin");
        assert_eq!(
            a.files[1].sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(manifest_of(dir.path(), 10).unwrap(), a);
        std::fs::write(dir.path().join("sub/weights.bin"), b"abd").unwrap();
        std::fs::write(dir.path().join("extra"), b"").unwrap();
        let b = manifest_of(dir.path(), 10).unwrap();
        let m = a.mismatch(&b).unwrap();
        assert_eq!(m.changed, ["sub/weights.bin"]);
        assert_eq!(m.unexpected, ["extra"]);
        assert!(matches!(
            manifest_of(dir.path(), 1),
            Err(ManifestError::TooManyFiles { .. })
        ));
    }
}
