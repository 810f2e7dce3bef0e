//! A [`Host`] in memory, for running the filter's own code outside Envoy: a shared-data store
//! with Envoy's compare-and-swap rule ([`SharedStore`]), counters and gauges, a clock the caller
//! sets, and one response (status and body) for the response-side watches. It has no request
//! headers or body, makes no calls and answers nothing itself: the offline evaluator drives the
//! observation code (`observe`, `fold_tally`, the success watch) through it, so the evaluator
//! decides as the filter does without a copy of its glue. The scenario tests' double
//! (`host::fake`) keeps its shared data in the same [`SharedStore`].

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::host::{CasMismatch, Host, Level, Metric};

/// Envoy's shared data: values with a cas each; a write with a stale cas is refused.
#[derive(Debug, Default)]
pub struct SharedStore {
    map: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
    /// Writes to refuse before accepting again (a host under contention).
    pub failing_sets: u32,
    /// Bytes copied out of and into the store, since the last reset.
    pub traffic: (usize, usize),
}

impl SharedStore {
    /// A value and its cas (`None`, `None` when missing).
    pub fn get(&mut self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        match self.map.get(key) {
            Some((v, cas)) => {
                self.traffic.0 += v.len();
                (Some(v.clone()), Some(*cas))
            }
            None => (None, None),
        }
    }

    /// Writes a value; with a cas, only if nobody wrote it since.
    pub fn set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), CasMismatch> {
        if self.failing_sets > 0 {
            self.failing_sets -= 1;
            return Err(CasMismatch);
        }
        if let (Some(cas), Some((_, current))) = (cas, self.map.get(key)) {
            if cas != *current {
                return Err(CasMismatch);
            }
        }
        self.next_cas = self.next_cas.wrapping_add(1);
        self.traffic.1 += value.len();
        self.map
            .insert(key.to_string(), (value.to_vec(), self.next_cas));
        Ok(())
    }

    /// A value, without counting it as traffic.
    pub fn peek(&self, key: &str) -> Option<&[u8]> {
        self.map.get(key).map(|(v, _)| v.as_slice())
    }

    /// Every key, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.map.keys().cloned().collect();
        keys.sort();
        keys
    }
}

/// A response as the watches read it: its headers and its one body chunk.
type Response = (Vec<(String, Vec<u8>)>, Vec<u8>);

/// The in-memory host; see the module docs.
#[derive(Debug, Default)]
pub struct MemoryHost {
    shared: RefCell<SharedStore>,
    metrics: RefCell<BTreeMap<Metric, u64>>,
    now: Cell<u64>,
    response: RefCell<Response>,
}

impl MemoryHost {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set_now(&self, ms: u64) {
        self.now.set(ms);
    }

    /// The response the response-side watches read next: its headers and its (one) body chunk.
    pub fn set_response(&self, headers: &[(&str, &[u8])], body: &[u8]) {
        *self.response.borrow_mut() = (
            headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
            body.to_vec(),
        );
    }

    /// A counter's or gauge's value.
    pub fn metric(&self, m: Metric) -> u64 {
        self.metrics.borrow().get(&m).copied().unwrap_or(0)
    }
}

impl Host for MemoryHost {
    fn request_header(&self, _name: &str) -> Option<Vec<u8>> {
        None
    }

    fn property(&self, _path: &[&str]) -> Option<Vec<u8>> {
        None
    }

    fn set_request_header(&self, _name: &str, _value: &[u8]) {}

    fn remove_request_header(&self, _name: &str) {}

    fn request_body(&self, _start: usize, _len: usize) -> Option<Vec<u8>> {
        None
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        let response = self.response.borrow();
        response
            .0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    fn response_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        let response = self.response.borrow();
        response
            .1
            .get(start..start.checked_add(len)?)
            .map(<[u8]>::to_vec)
    }

    fn send_response(&self, _status: u32, _headers: &[(&str, &[u8])], _body: &[u8]) -> bool {
        false
    }

    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.shared.borrow_mut().get(key)
    }

    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), CasMismatch> {
        self.shared.borrow_mut().set(key, value, cas)
    }

    fn dispatch(
        &self,
        _cluster: &str,
        _headers: &[(&str, &str)],
        _body: Option<&[u8]>,
        _timeout: Duration,
    ) -> Option<u32> {
        None
    }

    fn call_response_status(&self) -> Option<u16> {
        None
    }

    fn call_response_body(&self, _len: usize) -> Option<Vec<u8>> {
        None
    }

    fn count(&self, metric: Metric, by: u64) {
        *self.metrics.borrow_mut().entry(metric).or_default() += by;
    }

    fn gauge(&self, metric: Metric, value: u64) {
        self.metrics.borrow_mut().insert(metric, value);
    }

    fn now_ms(&self) -> u64 {
        self.now.get()
    }

    fn log(&self, _level: Level, _message: &str) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_with_a_stale_cas_is_refused_and_a_fresh_one_lands() {
        let h = MemoryHost::new();
        assert_eq!(h.shared_get("k"), (None, None));
        h.shared_set("k", b"a", None).unwrap();
        let (v, cas) = h.shared_get("k");
        assert_eq!(v.as_deref(), Some(&b"a"[..]));
        h.shared_set("k", b"b", cas).unwrap();
        assert_eq!(h.shared_set("k", b"c", cas), Err(CasMismatch));
        assert_eq!(h.shared_get("k").0.as_deref(), Some(&b"b"[..]));
    }

    #[test]
    fn the_response_set_is_what_the_watches_read() {
        let h = MemoryHost::new();
        h.set_response(&[(":status", b"200")], b"{\"x\":1}");
        assert_eq!(h.response_header(":status").as_deref(), Some(&b"200"[..]));
        assert_eq!(h.response_body(2, 1).as_deref(), Some(&b"x"[..]));
        assert_eq!(h.response_body(6, 5), None);
    }
}
