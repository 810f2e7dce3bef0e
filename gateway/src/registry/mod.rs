//! The adapter registry: the one index of truth of what each adapter name is (its current
//! version's path, rank, alpha, target modules, SHA-256 manifest), whose tenant and tier it
//! serves, whether an operator pinned it, and the versions it had before (for rollbacks).
//!
//! Registration reads `adapter_config.json` and hashes the directory when the path is local
//! ([`prepare_version`], blocking file I/O: call it off the async runtime). Verification before a
//! load is [`verify_for_load`]: the files on disk must still match the registered manifest.

pub mod adapter_config;
pub mod manifest;
pub mod watch;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use manifest::{manifest_of, Manifest, ManifestMismatch};
pub use watch::{RolloutWatch, Verdict, WatchOutcome};

use crate::tier::Tier;

/// Versions kept per adapter besides the current one.
pub const HISTORY: usize = 8;
/// Adapters the registry holds at most.
pub const MAX_ADAPTERS: usize = 10_000;

/// One version of an adapter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterVersion {
    pub version: String,
    /// Where pods load it from (a path on the pods' filesystem, which the gateway shares when
    /// it can verify the manifest).
    pub path: String,
    pub rank: Option<u32>,
    pub alpha: Option<f64>,
    #[serde(default)]
    pub target_modules: Vec<String>,
    /// `None` when the path is not a local directory: such a version cannot be verified.
    pub manifest: Option<Manifest>,
    pub registered_at_ms: u64,
}

/// An adapter name and everything known about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterRecord {
    pub name: String,
    pub tenant: Option<String>,
    pub tier: Tier,
    /// Pinned by an operator: kept resident on the pods it is placed on.
    pub pinned: bool,
    pub current: AdapterVersion,
    /// Earlier versions, newest first (at most [`HISTORY`]).
    #[serde(default)]
    pub history: Vec<AdapterVersion>,
    /// The error watch of its last rollout ([`watch`]), open or ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<RolloutWatch>,
}

/// What an operator asks to register.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterAdapter {
    pub name: String,
    pub path: String,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub tier: Option<Tier>,
    #[serde(default)]
    pub rank: Option<u32>,
    #[serde(default)]
    pub alpha: Option<f64>,
    #[serde(default)]
    pub target_modules: Option<Vec<String>>,
    #[serde(default)]
    pub pinned: Option<bool>,
}

/// Why a registration or verification failed; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("adapter {0:?}: not registered")]
    Unknown(String),
    #[error("registry: full ({MAX_ADAPTERS} adapters)")]
    Full,
    #[error("adapter {name:?} version {version:?}: files do not match the manifest: {detail}")]
    ManifestMismatch {
        name: String,
        version: String,
        detail: String,
    },
    #[error("adapter {name:?}: {message}")]
    Unverifiable { name: String, message: String },
}

fn invalid(field: &'static str, message: impl Into<String>) -> RegistryError {
    RegistryError::Invalid {
        field,
        message: message.into(),
    }
}

/// Checks the request's fields (names, sizes) without touching the filesystem.
pub fn check_request(r: &RegisterAdapter) -> Result<(), RegistryError> {
    let name_ok = !r.name.is_empty()
        && r.name.len() <= 128
        && r.name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/".contains(c));
    if !name_ok {
        return Err(invalid(
            "name",
            format!("{:?}: 1..128 of [A-Za-z0-9-_.:/]", r.name),
        ));
    }
    if r.path.is_empty() || r.path.len() > 4096 {
        return Err(invalid("path", "must be 1..4096 bytes"));
    }
    if let Some(v) = &r.version {
        if v.is_empty() || v.len() > 64 {
            return Err(invalid("version", "must be 1..64 bytes"));
        }
    }
    if let Some(t) = &r.tenant {
        if t.is_empty() || t.len() > 128 {
            return Err(invalid("tenant", "must be 1..128 bytes"));
        }
    }
    if let Some(m) = &r.target_modules {
        if m.len() > 64 || m.iter().any(|s| s.is_empty() || s.len() > 128) {
            return Err(invalid(
                "target_modules",
                "at most 64 names of 1..128 bytes",
            ));
        }
    }
    if matches!(r.rank, Some(0) | Some(4097..)) {
        return Err(invalid("rank", "must be 1..4096"));
    }
    if r.alpha.is_some_and(|a| !(a > 0.0 && a.is_finite())) {
        return Err(invalid("alpha", "must be > 0"));
    }
    Ok(())
}

/// Builds the version a request describes: reads `adapter_config.json` and hashes the directory
/// when `path` is a local directory (blocking I/O). Explicit request fields win over the file.
pub fn prepare_version(
    r: &RegisterAdapter,
    max_files: usize,
    now_ms: u64,
) -> Result<AdapterVersion, RegistryError> {
    check_request(r)?;
    let dir = Path::new(&r.path);
    let (peft, manifest) = if dir.is_dir() {
        let peft = adapter_config::read_peft_config(dir).map_err(|m| invalid("path", m))?;
        let manifest = manifest_of(dir, max_files).map_err(|e| invalid("path", e.to_string()))?;
        (peft.unwrap_or_default(), Some(manifest))
    } else {
        (adapter_config::PeftConfig::default(), None)
    };
    let version = r.version.clone().unwrap_or_else(|| {
        manifest
            .as_ref()
            .map(|m| m.digest.chars().take(12).collect())
            .unwrap_or_else(|| "1".into())
    });
    Ok(AdapterVersion {
        version,
        path: r.path.clone(),
        rank: r.rank.or(peft.r),
        alpha: r.alpha.or(peft.lora_alpha),
        target_modules: r
            .target_modules
            .clone()
            .or_else(|| peft.target_modules.map(|t| t.into_vec()))
            .unwrap_or_default(),
        manifest,
        registered_at_ms: now_ms,
    })
}

/// Checks that `version`'s files still match its manifest (blocking I/O). A version without a
/// manifest is accepted: there is nothing to check it against.
pub fn verify_for_load(
    name: &str,
    version: &AdapterVersion,
    max_files: usize,
) -> Result<(), RegistryError> {
    let Some(expected) = &version.manifest else {
        return Ok(());
    };
    let actual = manifest_of(Path::new(&version.path), max_files).map_err(|e| {
        RegistryError::ManifestMismatch {
            name: name.to_string(),
            version: version.version.clone(),
            detail: e.to_string(),
        }
    })?;
    match expected.mismatch(&actual) {
        None => Ok(()),
        Some(m) => Err(RegistryError::ManifestMismatch {
            name: name.to_string(),
            version: version.version.clone(),
            detail: m.summary(),
        }),
    }
}

/// What a registration did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Registered {
    pub name: String,
    pub version: String,
    /// The version it replaced, when this was a rollout or rollback.
    pub previous_version: Option<String>,
}

/// The registry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AdapterRegistry {
    adapters: BTreeMap<String, AdapterRecord>,
}

impl AdapterRegistry {
    pub fn get(&self, name: &str) -> Option<&AdapterRecord> {
        self.adapters.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &AdapterRecord> {
        self.adapters.values()
    }

    pub fn len(&self) -> usize {
        self.adapters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.adapters.is_empty()
    }

    /// Registers `name` at `tier`, version "1" at `path`, with no manifest: what simulated pods
    /// (the evaluator, tests) serve, where there are no files to verify.
    pub fn register_unverified(
        &mut self,
        name: &str,
        path: &str,
        tier: Tier,
        pinned: bool,
    ) -> Result<Registered, RegistryError> {
        let request = RegisterAdapter {
            name: name.to_string(),
            path: path.to_string(),
            version: None,
            tenant: None,
            tier: Some(tier),
            rank: None,
            alpha: None,
            target_modules: None,
            pinned: Some(pinned),
        };
        let version = AdapterVersion {
            version: "1".into(),
            path: path.to_string(),
            rank: None,
            alpha: None,
            target_modules: Vec::new(),
            manifest: None,
            registered_at_ms: 0,
        };
        self.register(&request, version)
    }

    /// Registers a prepared version: a new name, or a new version of a known name (the old one
    /// goes to the history). Re-registering the current version updates metadata only.
    pub fn register(
        &mut self,
        r: &RegisterAdapter,
        version: AdapterVersion,
    ) -> Result<Registered, RegistryError> {
        if !self.adapters.contains_key(&r.name) && self.adapters.len() >= MAX_ADAPTERS {
            return Err(RegistryError::Full);
        }
        let name = r.name.clone();
        let new_version = version.version.clone();
        let previous_version = match self.adapters.get_mut(&name) {
            Some(record) => {
                if let Some(t) = &r.tenant {
                    record.tenant = Some(t.clone());
                }
                if let Some(t) = r.tier {
                    record.tier = t;
                }
                if let Some(p) = r.pinned {
                    record.pinned = p;
                }
                if record.current.version == version.version {
                    record.current = version;
                    None
                } else {
                    record.watch = None;
                    let old = std::mem::replace(&mut record.current, version);
                    record.history.retain(|v| v.version != new_version);
                    let previous = old.version.clone();
                    record.history.insert(0, old);
                    record.history.truncate(HISTORY);
                    Some(previous)
                }
            }
            None => {
                self.adapters.insert(
                    name.clone(),
                    AdapterRecord {
                        name: name.clone(),
                        tenant: r.tenant.clone(),
                        tier: r.tier.unwrap_or_default(),
                        pinned: r.pinned.unwrap_or(false),
                        current: version,
                        history: Vec::new(),
                        watch: None,
                    },
                );
                None
            }
        };
        Ok(Registered {
            name,
            version: new_version,
            previous_version,
        })
    }

    /// Makes an earlier version current again (a rollback); the current one goes to history.
    pub fn rollback(&mut self, name: &str, version: &str) -> Result<Registered, RegistryError> {
        let record = self
            .adapters
            .get_mut(name)
            .ok_or_else(|| RegistryError::Unknown(name.to_string()))?;
        let i = record
            .history
            .iter()
            .position(|v| v.version == version)
            .ok_or_else(|| invalid("version", format!("{version:?}: not in the history")))?;
        let target = record.history.remove(i);
        // an open watch watched the version going away; an ended one is the record of why
        if record.watch.as_ref().is_some_and(RolloutWatch::is_open) {
            record.watch = None;
        }
        let old = std::mem::replace(&mut record.current, target);
        let previous = old.version.clone();
        record.history.insert(0, old);
        record.history.truncate(HISTORY);
        Ok(Registered {
            name: name.to_string(),
            version: version.to_string(),
            previous_version: Some(previous),
        })
    }

    /// Sets the operator pin; returns whether it changed.
    pub fn set_pinned(&mut self, name: &str, pinned: bool) -> Result<bool, RegistryError> {
        let record = self
            .adapters
            .get_mut(name)
            .ok_or_else(|| RegistryError::Unknown(name.to_string()))?;
        let changed = record.pinned != pinned;
        record.pinned = pinned;
        Ok(changed)
    }

    pub fn remove(&mut self, name: &str) -> Option<AdapterRecord> {
        self.adapters.remove(name)
    }

    /// Starts the error watch of `name`'s rollout (replacing its last one).
    pub fn watch(&mut self, name: &str, watch: RolloutWatch) {
        if let Some(record) = self.adapters.get_mut(name) {
            record.watch = Some(watch);
        }
    }

    /// Whether a rollout is under watch.
    pub fn watching(&self) -> bool {
        self.adapters
            .values()
            .any(|r| r.watch.as_ref().is_some_and(RolloutWatch::is_open))
    }

    /// Counts a request for `model` (when it is an adapter under watch).
    pub fn count_outcome(&mut self, model: &str, at_ms: u64, status: u16) {
        if let Some(w) = self.adapters.get_mut(model).and_then(|r| r.watch.as_mut()) {
            w.count(at_ms, status);
        }
    }

    /// The open watches' verdicts at `now_ms`, other than [`Verdict::Watching`].
    pub fn watch_verdicts(&self, now_ms: u64, min_requests: u64) -> Vec<(String, String, Verdict)> {
        self.adapters
            .values()
            .filter_map(|r| {
                let w = r.watch.as_ref()?;
                match w.verdict(now_ms, min_requests) {
                    Verdict::Watching => None,
                    v => Some((r.name.clone(), w.previous.clone(), v)),
                }
            })
            .collect()
    }

    /// Ends `name`'s open watch (kept on its record); returns it.
    pub fn end_watch(
        &mut self,
        name: &str,
        at_ms: u64,
        outcome: WatchOutcome,
        detail: String,
    ) -> Option<RolloutWatch> {
        let w = self.adapters.get_mut(name)?.watch.as_mut()?;
        if !w.is_open() {
            return None;
        }
        w.end(at_ms, outcome, detail);
        Some(w.clone())
    }

    /// Replaces the detail of `name`'s ended watch (what its rollback found).
    pub fn amend_ended_watch(&mut self, name: &str, detail: String) {
        let end = self
            .adapters
            .get_mut(name)
            .and_then(|r| r.watch.as_mut())
            .and_then(|w| w.ended.as_mut());
        if let Some(end) = end {
            end.detail = detail;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: &str, path: &str, version: Option<&str>) -> RegisterAdapter {
        RegisterAdapter {
            name: name.into(),
            path: path.into(),
            version: version.map(str::to_string),
            tenant: Some("acme".into()),
            tier: Some(Tier::Gold),
            rank: None,
            alpha: None,
            target_modules: None,
            pinned: None,
        }
    }

    #[test]
    fn registration_reads_the_directory_and_verification_catches_changes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("adapter_config.json"),
            br#"{"r": 8, "lora_alpha": 16, "target_modules": "q_proj"}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("adapter_model.safetensors"), b"weights").unwrap();
        let path = dir.path().to_str().unwrap();
        let r = request("sql", path, Some("v1"));
        let v = prepare_version(&r, 100, 5).unwrap();
        assert_eq!((v.rank, v.alpha), (Some(8), Some(16.0)));
        assert_eq!(v.target_modules, ["q_proj"]);
        assert!(verify_for_load("sql", &v, 100).is_ok());
        std::fs::write(dir.path().join("adapter_model.safetensors"), b"tampered").unwrap();
        let e = verify_for_load("sql", &v, 100).unwrap_err();
        assert!(e.to_string().contains("adapter_model.safetensors"), "{e}");
    }

    fn v(version: &str) -> AdapterVersion {
        AdapterVersion {
            version: version.into(),
            path: "/x".into(),
            rank: None,
            alpha: None,
            target_modules: vec![],
            manifest: None,
            registered_at_ms: 0,
        }
    }

    #[test]
    fn new_versions_roll_out_and_back() {
        let mut reg = AdapterRegistry::default();
        let r = request("a", "/x", None);
        assert_eq!(reg.register(&r, v("1")).unwrap().previous_version, None);
        assert_eq!(
            reg.register(&r, v("2"))
                .unwrap()
                .previous_version
                .as_deref(),
            Some("1")
        );
        let back = reg.rollback("a", "1").unwrap();
        assert_eq!(back.previous_version.as_deref(), Some("2"));
        assert_eq!(reg.get("a").unwrap().current.version, "1");
        assert_eq!(reg.get("a").unwrap().history[0].version, "2");
        assert!(reg.rollback("a", "9").is_err());
        assert!(reg.set_pinned("a", true).unwrap());
        assert!(reg.set_pinned("zz", true).is_err());
    }

    #[test]
    fn a_rollback_drops_an_open_watch_and_keeps_an_ended_one() {
        let mut reg = AdapterRegistry::default();
        let r = request("a", "/x", None);
        for version in ["1", "2", "3"] {
            reg.register(&r, v(version)).unwrap();
        }
        reg.watch("a", RolloutWatch::new("3", "2", 0, 60_000));
        reg.rollback("a", "2").unwrap();
        assert_eq!(reg.get("a").unwrap().watch, None);

        reg.watch("a", RolloutWatch::new("2", "1", 0, 60_000));
        let detail = "version \"2\": rolled back to \"1\"".to_string();
        reg.end_watch("a", 5, WatchOutcome::RolledBack, detail.clone());
        reg.rollback("a", "1").unwrap();
        let end = reg.get("a").unwrap().watch.clone().unwrap().ended.unwrap();
        assert_eq!(
            (end.outcome, end.detail),
            (WatchOutcome::RolledBack, detail)
        );
        reg.amend_ended_watch("a", "not re-loaded".into());
        let end = reg.get("a").unwrap().watch.clone().unwrap().ended.unwrap();
        assert_eq!(end.detail, "not re-loaded");
    }

    #[test]
    fn bad_requests_name_the_field() {
        let mut r = request("bad name", "/x", None);
        assert!(check_request(&r)
            .unwrap_err()
            .to_string()
            .starts_with("name:"));
        r.name = "ok".into();
        r.rank = Some(0);
        assert!(check_request(&r)
            .unwrap_err()
            .to_string()
            .starts_with("rank:"));
    }
}
