//! The test double of [`Host`]: headers, body, a shared-data store (shareable between several
//! doubles, as Envoy's is between workers), recorded calls and scripted replies, metrics, a
//! settable clock. For tests only: the unit tests beside the code and the scenario tests
//! (`filter/tests/scenarios`) share it, hence public in native builds (never in the wasm one).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use crate::host::memory::SharedStore;
use crate::host::{CasMismatch, Host, Level, Metric};

/// A call the filter made.
#[derive(Debug, Clone)]
pub struct RecordedCall {
    pub token: u32,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout: Duration,
}

/// A response the filter sent itself.
#[derive(Debug, Clone)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// Host calls the filter made, by kind (this double's, not its siblings').
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HostCalls {
    pub shared_get: u64,
    pub shared_set: u64,
    /// Counter increments and gauge sets.
    pub metric: u64,
    /// Calls out (`dispatch`).
    pub dispatch: u64,
    /// Headers, body, properties, local replies, clock, logs.
    pub other: u64,
}

impl HostCalls {
    pub fn total(&self) -> u64 {
        self.shared_get + self.shared_set + self.metric + self.dispatch + self.other
    }
}

#[derive(Debug, Default)]
pub struct FakeHost {
    host_calls: Cell<HostCalls>,
    shared: Rc<RefCell<SharedStore>>,
    headers: RefCell<Vec<(String, Vec<u8>)>>,
    /// Whether the request's headers went on (Envoy's wasm host then no longer gives them).
    headers_continued: Cell<bool>,
    body: RefCell<Vec<u8>>,
    body_reads: Cell<u32>,
    now: Cell<u64>,
    metrics: Rc<RefCell<BTreeMap<Metric, u64>>>,
    calls: RefCell<Vec<RecordedCall>>,
    refuse_calls: Cell<bool>,
    reply: RefCell<(Option<u16>, Vec<u8>)>,
    response_headers: RefCell<Vec<(String, Vec<u8>)>>,
    response_chunk: RefCell<Vec<u8>>,
    refuse_local_replies: Cell<bool>,
    /// Responses the filter answered with itself: status, headers, body.
    pub local_replies: RefCell<Vec<LocalReply>>,
    pub logs: RefCell<Vec<String>>,
    /// Stream properties by path joined with `.` (`connection.id`).
    pub properties: RefCell<BTreeMap<String, Vec<u8>>>,
}

impl FakeHost {
    pub fn new() -> Self {
        let h = Self::default();
        h.now.set(1_000_000);
        h
    }

    /// Another worker: same shared data and metrics, its own request and calls.
    pub fn sibling(&self) -> Self {
        let h = Self {
            shared: self.shared.clone(),
            metrics: self.metrics.clone(),
            ..Self::default()
        };
        h.now.set(self.now.get());
        h
    }

    pub fn now_ms_for_tests(&self) -> u64 {
        self.now.get()
    }

    pub fn set_now(&self, ms: u64) {
        self.now.set(ms);
    }

    pub fn set_request(&self, headers: &[(&str, &[u8])], body: &[u8]) {
        *self.headers.borrow_mut() = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect();
        *self.body.borrow_mut() = body.to_vec();
        self.headers_continued.set(false);
    }

    /// The filter let the request's headers go on: from now on, as in Envoy, the filter can no
    /// longer read or change them (the wasm host drops its reference to the header map).
    pub fn continue_headers(&self) {
        self.headers_continued.set(true);
    }

    /// How many times the filter read the request body.
    pub fn body_reads(&self) -> u32 {
        self.body_reads.get()
    }

    /// A request header as it goes upstream (what the pod gets), however far the request is.
    pub fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.headers
            .borrow()
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    pub fn fail_next_sets(&self, n: u32) {
        self.shared.borrow_mut().failing_sets = n;
    }

    pub fn shared_value(&self, key: &str) -> Option<Vec<u8>> {
        self.shared.borrow().peek(key).map(<[u8]>::to_vec)
    }

    /// Bytes of shared data read and written since the last reset.
    pub fn shared_traffic(&self) -> (usize, usize) {
        self.shared.borrow().traffic
    }

    pub fn reset_shared_traffic(&self) {
        self.shared.borrow_mut().traffic = (0, 0);
    }

    pub fn shared_keys(&self) -> Vec<String> {
        self.shared.borrow().keys()
    }

    pub fn metric(&self, m: Metric) -> u64 {
        self.metrics.borrow().get(&m).copied().unwrap_or(0)
    }

    pub fn calls(&self) -> Vec<RecordedCall> {
        self.calls.borrow().clone()
    }

    pub fn take_calls(&self) -> Vec<RecordedCall> {
        std::mem::take(&mut *self.calls.borrow_mut())
    }

    pub fn refuse_calls(&self, refuse: bool) {
        self.refuse_calls.set(refuse);
    }

    /// The pod's response headers, as the response callbacks see them.
    pub fn set_response_headers(&self, headers: &[(&str, &[u8])]) {
        *self.response_headers.borrow_mut() = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect();
    }

    /// The response body chunk being delivered.
    pub fn set_response_chunk(&self, chunk: &[u8]) {
        *self.response_chunk.borrow_mut() = chunk.to_vec();
    }

    pub fn refuse_local_replies(&self, refuse: bool) {
        self.refuse_local_replies.set(refuse);
    }

    pub fn set_reply(&self, status: Option<u16>, body: &[u8]) {
        *self.reply.borrow_mut() = (status, body.to_vec());
    }

    /// Host calls made through this double since the last [`FakeHost::take_host_calls`].
    pub fn take_host_calls(&self) -> HostCalls {
        self.host_calls.take()
    }

    fn called(&self, kind: impl FnOnce(&mut HostCalls) -> &mut u64) {
        let mut calls = self.host_calls.get();
        *kind(&mut calls) += 1;
        self.host_calls.set(calls);
    }
}

impl Host for FakeHost {
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        self.called(|c| &mut c.other);
        if self.headers_continued.get() {
            return None;
        }
        self.header(name)
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.called(|c| &mut c.other);
        self.properties.borrow().get(&path.join(".")).cloned()
    }

    fn set_request_header(&self, name: &str, value: &[u8]) {
        self.called(|c| &mut c.other);
        if self.headers_continued.get() {
            return;
        }
        self.headers.borrow_mut().retain(|(k, _)| k != name);
        self.headers
            .borrow_mut()
            .push((name.to_string(), value.to_vec()));
    }

    fn remove_request_header(&self, name: &str) {
        self.called(|c| &mut c.other);
        if self.headers_continued.get() {
            return;
        }
        self.headers.borrow_mut().retain(|(k, _)| k != name);
    }

    fn request_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        self.called(|c| &mut c.other);
        self.body_reads.set(self.body_reads.get() + 1);
        let body = self.body.borrow();
        body.get(start..start.checked_add(len)?).map(<[u8]>::to_vec)
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        self.called(|c| &mut c.other);
        self.response_headers
            .borrow()
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    fn response_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        self.called(|c| &mut c.other);
        let chunk = self.response_chunk.borrow();
        chunk
            .get(start..start.checked_add(len)?)
            .map(<[u8]>::to_vec)
    }

    fn send_response(&self, status: u32, headers: &[(&str, &[u8])], body: &[u8]) -> bool {
        self.called(|c| &mut c.other);
        if self.refuse_local_replies.get() {
            return false;
        }
        self.local_replies.borrow_mut().push(LocalReply {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
            body: body.to_vec(),
        });
        true
    }

    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.called(|c| &mut c.shared_get);
        self.shared.borrow_mut().get(key)
    }

    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), CasMismatch> {
        self.called(|c| &mut c.shared_set);
        self.shared.borrow_mut().set(key, value, cas)
    }

    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Option<u32> {
        self.called(|c| &mut c.dispatch);
        if self.refuse_calls.get() {
            return None;
        }
        let mut calls = self.calls.borrow_mut();
        let token = 100 + calls.len() as u32;
        calls.push(RecordedCall {
            token,
            cluster: cluster.to_string(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.unwrap_or_default().to_vec(),
            timeout,
        });
        Some(token)
    }

    fn call_response_status(&self) -> Option<u16> {
        self.called(|c| &mut c.other);
        self.reply.borrow().0
    }

    fn call_response_body(&self, len: usize) -> Option<Vec<u8>> {
        self.called(|c| &mut c.other);
        let reply = self.reply.borrow();
        reply.1.get(..len).map(<[u8]>::to_vec)
    }

    fn count(&self, metric: Metric, by: u64) {
        self.called(|c| &mut c.metric);
        *self.metrics.borrow_mut().entry(metric).or_default() += by;
    }

    fn gauge(&self, metric: Metric, value: u64) {
        self.called(|c| &mut c.metric);
        self.metrics.borrow_mut().insert(metric, value);
    }

    fn now_ms(&self) -> u64 {
        self.called(|c| &mut c.other);
        self.now.get()
    }

    fn log(&self, level: Level, message: &str) {
        self.called(|c| &mut c.other);
        self.logs.borrow_mut().push(format!("{level:?} {message}"));
    }
}
