//! The same decisions in production and in the evaluator: one recorded input sequence (pods
//! joining, health rounds, requests, ticks) is driven through the gateway's shell — its real
//! health round, tick, signal ingestion and action execution, with an in-process engine over
//! simulated pods and a manual clock, fed the batches the filter's own observation code sends
//! (`FilterVm`: the filter's `observe`, tally fold, success watch and served-record rule) — and
//! through the evaluator's `prewarm` policy over an identical simulated fleet. Both must return the same actions, in the
//! same order, and route every request to the same pod.
//!
//! Time is virtual on both sides: the engine's calls end when the simulated pod says they do,
//! and the shell's steps (its ticks, health rounds, the requests, those ends) run in time order,
//! as the evaluator's event loop runs its own. Each action is compared with the time the core
//! returned it; texts and epochs are left out.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use podsim::RequestSpec;
use prewarm_core::{BlockChain, FingerprintConfig};
use prewarm_gateway::config::{EngineKind, GatewayConfig, PodSpec};
use prewarm_gateway::engine::{
    AdapterLoad, AdapterOutcome, Engine, EngineError, PodLoad, PrefillRequest, ServedModels,
};
use prewarm_gateway::policy::fleet::{Action, TICK_MS};
use prewarm_gateway::policy::lora::LoraSlots;
use prewarm_gateway::policy::{LoraDecision, Tier};
use prewarm_gateway::service::pods::PodSource;
use prewarm_gateway::service::{Clock, Gateway};
use prewarm_replay::offline::baselines::RoundRobin;
use prewarm_replay::offline::fleet::Fleet;
use prewarm_replay::offline::policy::{Policy, RequestCtx};
use prewarm_replay::offline::prewarm::execute;
use prewarm_replay::offline::prewarm::filter_vm::FilterVm;
use prewarm_replay::offline::prewarm::{
    choose_from_table, pod_load, served_adapters, PrefixIndex, Prewarm, PrewarmConfig,
};
use prewarm_replay::scenario::{FleetEvent, FleetSpec};

const ADAPTERS: [(&str, Tier); 3] = [
    ("a-gold", Tier::Gold),
    ("b-silver", Tier::Silver),
    ("c-bronze", Tier::Bronze),
];
/// Between two health rounds, as an operator's `POST /admin/pods` lands.
const JOIN_S: f64 = 20.5;
const END_S: f64 = 45.0;

fn spec() -> FleetSpec {
    FleetSpec {
        pods: 2,
        profile: "llama-8b-h100".into(),
        kv_blocks: 600,
        // Fewer slots than adapters: loads evict, so `/v1/models` reconciliations matter.
        max_loras: 1,
        max_cpu_loras: 2,
        adapter_rank: 16,
        adapter_replicas: 2,
        // One pool: with tier pools the gold adapter gets a pod of its own (its one slot holds
        // it, `policy::pools`), stays resident, and no pin ever has to load it, so the sequence
        // would exercise no pin.
        tier_pools: false,
        gold_pool_share: 0.0,
        load_factor: Some(1.25),
        prefill_compute: podsim::PrefillCompute::Unshared,
    }
}

fn slots() -> LoraSlots {
    LoraSlots {
        max_loras: spec().max_loras,
        max_cpu_loras: spec().max_cpu_loras,
    }
}

fn sim_fleet() -> Fleet {
    let names: Vec<String> = ADAPTERS.iter().map(|(n, _)| n.to_string()).collect();
    Fleet::new(&spec(), &names).unwrap()
}

/// One request of the recorded sequence.
struct Request {
    at_s: f64,
    user: String,
    model: String,
    adapter: Option<String>,
    text: String,
}

/// Six users, each re-sending its own template with a new question (so the filter's similarity
/// trigger fires); two use the gold adapter, one each the silver and bronze ones, two the base
/// model; three of them go quiet at 25 s while one-off prompts keep churning the caches, so
/// keep-warm has templates to re-prefill. None arrives in the first seconds after a pod comes
/// up.
fn requests(base: &str) -> Vec<Request> {
    let mut out = Vec::new();
    for k in 0..200u32 {
        let at_s = 2.05 + 0.2 * f64::from(k);
        if (JOIN_S..JOIN_S + 3.0).contains(&at_s) || at_s > END_S - 2.0 {
            continue;
        }
        let u = (k % 8) as usize;
        if u >= 6 || (u >= 3 && at_s > 25.0) {
            let noise: String = (0..300).map(|i| format!("once{k} word{i} ")).collect();
            out.push(Request {
                at_s,
                user: format!("once-{k}"),
                model: base.to_string(),
                adapter: None,
                text: noise,
            });
            continue;
        }
        let adapter = match u {
            0 | 1 => Some("a-gold"),
            2 => Some("b-silver"),
            3 => Some("c-bronze"),
            _ => None,
        };
        let template: String = (0..420).map(|i| format!("user{u} rule {i}; ")).collect();
        out.push(Request {
            at_s,
            user: format!("user-{u}"),
            model: adapter.unwrap_or(base).to_string(),
            adapter: adapter.map(str::to_string),
            text: format!("{template} question {k} about item {}", k * 7),
        });
    }
    out
}

fn ctx<'a>(r: &'a Request, index: usize, chain: &'a BlockChain) -> RequestCtx<'a> {
    RequestCtx {
        index,
        now_s: r.at_s,
        model: &r.model,
        adapter: r.adapter.as_deref(),
        tenant: None,
        tier: Tier::Bronze,
        user: Some(&r.user),
        canonical: &r.text,
        chain,
        max_tokens: 8,
    }
}

fn spec_of(r: &Request) -> RequestSpec {
    RequestSpec {
        model: r.model.clone(),
        canonical_prompt: r.text.clone(),
        max_tokens: Some(8),
    }
}

/// What two drivers must agree on: when the core returned the action, and the action without
/// its epoch or text.
fn describe((at, a): &(u64, Action)) -> String {
    match a {
        Action::Prefill(p) => format!("{at} {} prefill {} {:?}", p.pod, p.key, p.cause),
        Action::Adapters(c) => format!("{at} {} adapters {:?} {:?}", c.pod, c.decisions, c.cause),
    }
}

/// The evaluator: the `prewarm` policy driven as `offline::run` drives it (events and wake-ups
/// due before each request, then route, serve, `served`).
fn evaluator(requests: &[Request]) -> (Vec<String>, Vec<usize>) {
    let mut fleet = sim_fleet();
    let names: Vec<String> = ADAPTERS.iter().map(|(n, _)| n.to_string()).collect();
    let tiers: BTreeMap<String, Tier> = ADAPTERS.iter().map(|(n, t)| (n.to_string(), *t)).collect();
    let config = PrewarmConfig::for_fleet(spec().kv_blocks, slots(), spec().adapter_replicas)
        .with_tier_pools(spec().tier_pools);
    let mut policy = Prewarm::new(config, &fleet, names, tiers);
    policy.core_mut().keep_journal();
    let fp = FingerprintConfig::default();
    let mut event = Some(FleetEvent::AddPods {
        count: 1,
        at_s: JOIN_S,
    });
    let mut routed = Vec::new();
    let mut run_until = |policy: &mut Prewarm, fleet: &mut Fleet, now: f64| loop {
        let ev = event.filter(|e| e.at_s() <= now);
        let wake = policy.next_wakeup().filter(|t| *t <= now);
        match (ev, wake) {
            (Some(e), w) if w.is_none_or(|w| e.at_s() <= w) => {
                event = None;
                fleet.add_pod().unwrap();
                policy.on_event(fleet, e, e.at_s());
            }
            (_, Some(w)) => policy.advance(fleet, w),
            _ => break,
        }
    };
    for (i, r) in requests.iter().enumerate() {
        run_until(&mut policy, &mut fleet, r.at_s);
        let chain = BlockChain::of(&r.model, r.text.as_bytes(), &fp);
        let c = ctx(r, i, &chain);
        let pod = policy.route(&fleet, &c);
        let admission = fleet.serve(pod, r.at_s, &spec_of(r)).unwrap();
        policy.served(&mut fleet, &c, pod, &admission);
        routed.push(pod);
    }
    run_until(&mut policy, &mut fleet, END_S);
    let journal = policy.core_mut().take_journal();
    (journal.iter().map(describe).collect(), routed)
}

/// Virtual time for the shell: the manual clock the gateway reads, a channel that wakes the
/// engine calls waiting for their end, and the ends still pending.
#[derive(Clone)]
struct VirtualTime {
    now: Arc<AtomicU64>,
    tx: Arc<tokio::sync::watch::Sender<u64>>,
    pending: Arc<Mutex<Vec<u64>>>,
}

impl VirtualTime {
    fn new() -> Self {
        Self {
            now: Arc::new(AtomicU64::new(0)),
            tx: Arc::new(tokio::sync::watch::channel(0).0),
            pending: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::Acquire)
    }

    /// Moves time to `ms` and lets every call due by then end, in order.
    async fn advance_to(&self, ms: u64) {
        self.now.store(ms, Ordering::Release);
        self.tx.send_replace(ms);
        settle().await;
    }

    fn next_end(&self) -> Option<u64> {
        self.pending.lock().unwrap().iter().copied().min()
    }

    /// A call that ends at `done_s` (simulated seconds): waits until time reaches it.
    fn ends_at<T: Send + 'static>(&self, done_s: f64, value: T) -> BoxFuture<'static, T> {
        let done = (done_s * 1000.0).round() as u64;
        let mut rx = self.tx.subscribe();
        let pending = self.pending.clone();
        pending.lock().unwrap().push(done);
        Box::pin(async move {
            while *rx.borrow_and_update() < done {
                if rx.changed().await.is_err() {
                    break;
                }
            }
            let mut p = pending.lock().unwrap();
            if let Some(i) = p.iter().position(|t| *t == done) {
                p.swap_remove(i);
            }
            value
        })
    }
}

/// Lets every spawned task run until none can make progress.
async fn settle() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

/// An engine over one simulated pod: the gateway's client calls become the evaluator's own
/// executions, started at the virtual now and ending when the simulated pod finishes them.
struct SimEngine {
    fleet: Arc<Mutex<Fleet>>,
    pod: usize,
    time: VirtualTime,
}

fn refused(pod: usize) -> EngineError {
    EngineError::Rejected {
        pod: format!("pod-{pod}"),
        url: "sim".into(),
        status: 400,
        kind: "refused".into(),
        message: "refused".into(),
    }
}

impl SimEngine {
    fn now_s(&self) -> f64 {
        self.time.now_ms() as f64 / 1000.0
    }

    fn run(
        &self,
        decision: LoraDecision,
    ) -> BoxFuture<'static, Result<AdapterOutcome, EngineError>> {
        let mut fleet = self.fleet.lock().unwrap();
        let e = execute::lora_decision(&mut fleet, self.pod, &decision, self.now_s());
        let result = if e.ok {
            Ok(AdapterOutcome::Done)
        } else {
            Err(refused(self.pod))
        };
        self.time.ends_at(e.done_s.max(self.now_s()), result)
    }
}

impl Engine for SimEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Vllm
    }

    fn health(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async { Ok(()) })
    }

    fn prefill<'a>(
        &'a self,
        request: &'a PrefillRequest,
    ) -> BoxFuture<'a, Result<(), EngineError>> {
        let mut fleet = self.fleet.lock().unwrap();
        let e = execute::prefill(
            &mut fleet,
            self.pod,
            &request.model,
            &request.prefix_text,
            self.now_s(),
        );
        let result = if e.ok { Ok(()) } else { Err(refused(self.pod)) };
        self.time.ends_at(e.done_s.max(self.now_s()), result)
    }

    fn load_adapter<'a>(
        &'a self,
        load: &'a AdapterLoad,
    ) -> BoxFuture<'a, Result<AdapterOutcome, EngineError>> {
        self.run(LoraDecision::Load(load.name.clone()))
    }

    fn unload_adapter<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<AdapterOutcome, EngineError>> {
        self.run(LoraDecision::Unload(name.to_string()))
    }

    fn embeddings<'a>(
        &'a self,
        _request: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Vec<u8>, EngineError>> {
        // the simulated pods serve completions only; the warm embedding store is not in the
        // decisions this test compares
        Box::pin(async move { Err(refused(self.pod)) })
    }

    fn models(&self) -> BoxFuture<'_, Result<ServedModels, EngineError>> {
        let fleet = self.fleet.lock().unwrap();
        let models = ServedModels {
            base: Some(fleet.base_model().to_string()),
            adapters: served_adapters(&fleet, self.pod)
                .into_iter()
                .map(|n| (n.clone(), format!("/adapters/{n}")))
                .collect(),
        };
        Box::pin(async move { Ok(models) })
    }

    fn load(&self) -> BoxFuture<'_, Result<PodLoad, EngineError>> {
        let mut fleet = self.fleet.lock().unwrap();
        let load = pod_load(&mut fleet, self.pod, self.now_s(), slots());
        Box::pin(async move { Ok(load) })
    }
}

/// The gateway's shell, stepped as its loops step it (a health round every
/// `pods.health_interval_ms`, `/v1/models` every 5th; the core's tick every [`TICK_MS`]), its
/// actions executed by the shell's executor as spawned tasks, as its loop does; everything in
/// virtual-time order.
async fn gateway(requests: &[Request]) -> (Vec<String>, Vec<usize>) {
    let fleet = Arc::new(Mutex::new(sim_fleet()));
    let base = fleet.lock().unwrap().base_model().to_string();
    let mut config = GatewayConfig::default();
    config.pods.base_model = base;
    config.pods.adapter_replicas = spec().adapter_replicas;
    config.pods.tier_pools = spec().tier_pools;
    let time = VirtualTime::new();
    let gw = Gateway::with_clock(config.clone(), Clock::Manual(time.now.clone()));
    gw.fleet(|f| {
        f.keep_journal();
        for (name, tier) in ADAPTERS {
            let path = format!("/adapters/{name}");
            f.registry_mut()
                .register_unverified(name, &path, tier, false)
                .unwrap();
        }
    });
    let add = |index: usize| {
        let id = format!("pod-{index}");
        let mut pod = PodSpec::new(id, format!("127.0.0.1:{}", 9000 + index));
        pod.max_loras = spec().max_loras;
        pod.max_cpu_loras = Some(spec().max_cpu_loras);
        pod.num_blocks = Some(spec().kv_blocks);
        let engine = Arc::new(SimEngine {
            fleet: fleet.clone(),
            pod: index,
            time: time.clone(),
        });
        gw.add_pod_with_engine(pod, PodSource::Admin, engine)
            .unwrap();
    };
    for i in 0..spec().pods {
        add(i);
    }
    let spawn_all = |actions: Vec<Action>| {
        for action in actions {
            let g = gw.clone();
            tokio::spawn(async move {
                g.execute(action).await;
            });
        }
    };
    let fp = FingerprintConfig::default();
    let mut filter = FilterVm::new(fleet.lock().unwrap().base_model());
    let mut fallback = RoundRobin::default();
    let mut index = PrefixIndex::for_fleet(&fleet.lock().unwrap());
    let mut routed = Vec::new();
    let mut next = requests.iter().enumerate().peekable();
    let join_ms = (JOIN_S * 1000.0) as u64;
    let end_ms = (END_S * 1000.0) as u64;
    let mut joined = false;
    let (mut next_tick, mut round) = (0u64, 0u64);
    loop {
        let request_ms = next.peek().map(|(_, r)| (r.at_s * 1000.0).round() as u64);
        let candidates = [
            Some(next_tick),
            Some(filter.next_tick_ms()),
            request_ms,
            time.next_end(),
            (!joined).then_some(join_ms),
        ];
        let Some(at) = candidates.into_iter().flatten().min() else {
            break;
        };
        if at > end_ms {
            break;
        }
        // Calls that end by `at` end first, as the evaluator completes them before anything
        // else due at the same time.
        time.advance_to(at).await;
        if !joined && at == join_ms {
            joined = true;
            let index = fleet.lock().unwrap().add_pod().unwrap();
            add(index);
        }
        if at == next_tick && next_tick.is_multiple_of(config.pods.health_interval_ms) {
            let g = gw.clone();
            let reconcile = round.is_multiple_of(5);
            round += 1;
            tokio::spawn(async move { g.health_round(reconcile).await });
            settle().await;
        }
        // the filter's tick: what it sends arrives before the core's tick due at the same time
        for batch in filter.tick(at) {
            let (_, actions) = gw.apply_signals(batch);
            spawn_all(actions);
            settle().await;
        }
        if at == next_tick {
            let generation = gw.state().fleet.table().generation;
            spawn_all(gw.tick());
            settle().await;
            next_tick += TICK_MS;
            // a table the tick changed: the filter seeds its placed prefixes when it adopts it,
            // as the evaluator seeds them at its tick
            let table = gw.state().fleet.table().clone();
            if table.generation != generation {
                index.seed(&table.prefixes, at);
            }
        }
        while let Some((i, r)) = next.next_if(|(_, r)| (r.at_s * 1000.0).round() as u64 == at) {
            let chain = BlockChain::of(&r.model, r.text.as_bytes(), &fp);
            let c = ctx(r, i, &chain);
            filter.observe(&c, at);
            let table = gw.state().fleet.table().clone();
            let (pod, by_table) = {
                let sim = fleet.lock().unwrap();
                let chosen = choose_from_table(&table, &r.model, &chain, &fp, &mut index, at)
                    .and_then(|id| sim.pods.iter().position(|p| p.id == id));
                match chosen {
                    Some(pod) => (pod, true),
                    None => (fallback.route(&sim, &c), false),
                }
            };
            filter.routed(&c, &format!("pod-{pod}"), by_table);
            fleet
                .lock()
                .unwrap()
                .serve(pod, r.at_s, &spec_of(r))
                .unwrap();
            routed.push(pod);
        }
    }
    let journal = gw.fleet(|f| f.take_journal());
    (journal.iter().map(describe).collect(), routed)
}

#[tokio::test(flavor = "current_thread")]
async fn the_gateway_and_the_evaluator_make_the_same_decisions() {
    let base = sim_fleet().base_model().to_string();
    let requests = requests(&base);
    let (evaluated, routed_offline) = evaluator(&requests);
    let (shipped, routed_live) = gateway(&requests).await;
    // The sequence exercises every kind of decision.
    for kind in ["prefill", "adapters", "Warmup", "KeepWarm", "Pin"] {
        assert!(
            shipped.iter().any(|a| a.contains(kind)),
            "no {kind} action in {shipped:#?}"
        );
    }
    assert_eq!(routed_live, routed_offline, "routing");
    let first_difference = shipped
        .iter()
        .zip(&evaluated)
        .position(|(a, b)| a != b)
        .unwrap_or(shipped.len().min(evaluated.len()));
    assert_eq!(
        shipped, evaluated,
        "action logs differ from action {first_difference}"
    );
}
