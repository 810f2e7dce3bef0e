//! What a proxy fetches per poll at issue 39's scale (1,000 pods × 5 adapters each, 100 placed
//! prefixes of 8 keys, as the `routing_table_1000` bench builds it): the whole table, the delta
//! of a typical one-pod change, and a simulated minute of busy shares measured from health
//! checks, published with hysteresis and served as deltas — against the table before (loads
//! rounded to 0.05, every change the whole table). Prints the figures:
//! `cargo test -p prewarm-gateway --test table_bytes -- --nocapture`.

use prewarm_core::fingerprint::BlockHash;
use prewarm_core::table_delta::{apply, diff};
use prewarm_core::wire::{PlacedPrefix, RoutingTable};
use prewarm_gateway::policy::{PodRoute, RoutingConfig, RoutingTableBuilder};

const PODS: usize = 1000;
/// Health checks in a busy share's window (a minute at the default one a second).
const WINDOW: usize = 60;

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// A uniform draw in [0, 1) from `(seed, i)`.
fn uniform(seed: u64, i: u64) -> f64 {
    (mix(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i) >> 11) as f64 / (1u64 << 53) as f64
}

struct Fleet {
    ids: Vec<String>,
    addresses: Vec<String>,
    adapters: Vec<Vec<String>>,
    placed: Vec<PlacedPrefix>,
}

impl Fleet {
    fn new() -> Self {
        let ids: Vec<String> = (0..PODS).map(|i| format!("pod-{i:04}")).collect();
        Self {
            addresses: (0..PODS)
                .map(|i| format!("10.{}.{}.{}:8000", i / 65536, (i / 256) % 256, i % 256))
                .collect(),
            adapters: (0..PODS)
                .map(|p| {
                    (0..5)
                        .map(|k| format!("adapter-{:04}", p * 5 + k))
                        .collect()
                })
                .collect(),
            placed: (0..100u64)
                .map(|i| PlacedPrefix {
                    keys: (0..8).map(|k| BlockHash(mix(i * 8 + k))).collect(),
                    pod: ids[(mix(i) % PODS as u64) as usize].clone(),
                })
                .collect(),
            ids,
        }
    }

    fn routes(&self, loads: &[f64], samples: u64, joined: bool) -> Vec<PodRoute<'_>> {
        let n = if joined { PODS } else { PODS - 1 };
        (0..n)
            .map(|i| PodRoute {
                id: &self.ids[i],
                address: &self.addresses[i],
                weight: 1.0,
                load: Some(loads[i]),
                load_samples: samples,
                wait_ms: None,
                adapters: self.adapters[i].iter().map(String::as_str).collect(),
                resident: Vec::new(),
                routable: true,
                warming: false,
            })
            .collect()
    }
}

fn builder(load_step: f64) -> RoutingTableBuilder {
    let config = RoutingConfig {
        load_step,
        ..RoutingConfig::default()
    };
    RoutingTableBuilder::new(64, config, 0)
}

/// The table built from `routes`, and whether it is a new generation.
fn build(
    b: &mut RoutingTableBuilder,
    routes: &[PodRoute<'_>],
    placed: &[PlacedPrefix],
    now: u64,
) -> bool {
    let pods = b.build(routes, now);
    let prefixes = b.place_prefixes(placed, now);
    pods || prefixes
}

#[test]
fn whole_table_and_one_pod_deltas_at_1000_pods() {
    let fleet = Fleet::new();
    let loads: Vec<f64> = (0..PODS).map(|i| uniform(1, i as u64)).collect();
    let mut b = builder(0.01);
    assert!(build(
        &mut b,
        &fleet.routes(&loads, 60, false),
        &fleet.placed,
        1
    ));
    let before: RoutingTable = b.table().clone();
    let whole = before.encode().len();

    // a pod joins
    assert!(build(
        &mut b,
        &fleet.routes(&loads, 60, true),
        &fleet.placed,
        2
    ));
    let joined = b.table().clone();
    let join = diff(&before, &joined).unwrap();
    assert_eq!(apply(&join, &before).as_ref(), Ok(&joined));

    // one pod's load moves past its step
    let mut moved = loads.clone();
    moved[10] = (moved[10] + 0.3) % 1.0;
    assert!(build(
        &mut b,
        &fleet.routes(&moved, 60, true),
        &fleet.placed,
        3
    ));
    let load = diff(&joined, b.table()).unwrap();
    assert_eq!(load.loads.len(), 1, "one pod, unless it moved the cap");

    // every pod's load jitters within its step (by at most half of it) on a fleet whose loads
    // are all under the cap (in [0.1, 0.4]: the cap is the floor, 0.5): no new generation, the
    // poll is a 304. (Near a cap a jitter is news: the pod crosses it.)
    let calm: Vec<f64> = (0..PODS)
        .map(|i| 0.1 + 0.3 * uniform(5, i as u64))
        .collect();
    let mut b = builder(0.01);
    assert!(build(
        &mut b,
        &fleet.routes(&calm, 60, true),
        &fleet.placed,
        4
    ));
    let jittered: Vec<f64> = calm
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let step = (l * (1.0 - l) / WINDOW as f64).sqrt();
            l + step * (uniform(2, i as u64) - 0.5)
        })
        .collect();
    let changed = build(&mut b, &fleet.routes(&jittered, 60, true), &fleet.placed, 5);

    println!("whole table, 1,000 pods x 5 adapters + 100 placed prefixes of 8 keys: {whole} bytes");
    println!("delta, one pod joins: {} bytes", join.encode().len());
    println!(
        "delta, one pod's load moves past its step: {} bytes",
        load.encode().len()
    );
    println!("every load jitters within its step: new generation: {changed} (a 304, 0 bytes)");
    assert!(join.encode().len() * 100 < whole);
    assert!(load.encode().len() * 1000 < whole);
    assert!(!changed);
}

/// Busy shares measured as the gateway measures them: each pod has a utilisation of its own
/// (uniform in [0.2, 0.9]) that drifts slowly, and a health check a second finds it busy with
/// that probability; the share is the last 60 checks' busy ones.
struct Shares {
    checks: Vec<Vec<bool>>,
    rho: Vec<f64>,
}

impl Shares {
    fn new() -> Self {
        let rho: Vec<f64> = (0..PODS)
            .map(|i| 0.2 + 0.7 * uniform(3, i as u64))
            .collect();
        let checks = (0..PODS)
            .map(|i| {
                (0..WINDOW)
                    .map(|s| uniform(4 + s as u64, i as u64) < rho[i])
                    .collect()
            })
            .collect();
        Self { checks, rho }
    }

    fn second(&mut self, t: u64) -> Vec<f64> {
        for (i, window) in self.checks.iter_mut().enumerate() {
            // a slow drift: ±0.1 over ten minutes
            let drift = 0.1 * ((t as f64 / 600.0) * std::f64::consts::TAU + i as f64).sin();
            let rho = (self.rho[i] + drift).clamp(0.0, 1.0);
            window.remove(0);
            window.push(uniform(1_000 + t, i as u64) < rho);
        }
        self.checks
            .iter()
            .map(|w| w.iter().filter(|b| **b).count() as f64 / WINDOW as f64)
            .collect()
    }
}

#[test]
fn a_simulated_fleet_polled_every_second() {
    let fleet = Fleet::new();
    let seconds = 300u64;
    // before: loads rounded to 0.05, no hysteresis (no samples: every change is news), every
    // change the whole table
    let mut before = builder(0.05);
    let mut before_shares = Shares::new();
    let (mut before_generations, mut before_bytes) = (0u64, 0usize);
    // now: hysteresis, and a proxy that holds the last generation gets the delta from it
    let mut now = builder(0.01);
    let mut now_shares = Shares::new();
    let (mut now_generations, mut now_bytes, mut pods_patched) = (0u64, 0usize, 0usize);
    let mut crossed = 0usize;
    for t in 0..seconds {
        let loads = before_shares.second(t);
        if build(
            &mut before,
            &fleet.routes(&loads, 0, true),
            &fleet.placed,
            t + 1,
        ) && t > 0
        {
            before_generations += 1;
            before_bytes += before.table().encode().len();
        }
        let loads = now_shares.second(t);
        let held = now.table().clone();
        if build(
            &mut now,
            &fleet.routes(&loads, 60, true),
            &fleet.placed,
            t + 1,
        ) && t > 0
        {
            now_generations += 1;
            let delta = diff(&held, now.table()).unwrap();
            assert_eq!(apply(&delta, &held).as_ref(), Ok(now.table()));
            pods_patched += delta.loads.len() + delta.upserted.len();
            let load_of = |t: &RoutingTable, id: &str| {
                t.pods
                    .iter()
                    .find(|p| p.id == id)
                    .and_then(|p| p.load)
                    .unwrap_or(0.0)
            };
            let cap = prewarm_core::placement::load_cap(
                now.table().pods.iter().map(|p| p.load.unwrap_or(0.0)),
                1.25,
            );
            crossed += delta
                .loads
                .iter()
                .filter(|p| (load_of(&held, &p.id) > cap) != (p.load.unwrap_or(0.0) > cap))
                .count();
            now_bytes += delta.encode().len().min(now.table().encode().len());
        }
    }
    let polls = (seconds - 1) as f64;
    let per_s = |bytes: usize| bytes as f64 / polls;
    println!(
        "{seconds} s of 1,000 pods' busy shares, one poll a second: before (0.05 rounding, whole \
         tables) {before_generations} new generations, {:.0} bytes a poll, {:.1} MB/s for 100 \
         proxies",
        per_s(before_bytes),
        per_s(before_bytes) * 100.0 / 1e6
    );
    println!(
        "now (hysteresis, deltas): {now_generations} new generations, {:.1} pods patched a \
         generation ({:.1} of them across the whole table's cap), {:.0} bytes a poll, {:.2} MB/s \
         for 100 proxies",
        pods_patched as f64 / now_generations.max(1) as f64,
        crossed as f64 / now_generations.max(1) as f64,
        per_s(now_bytes),
        per_s(now_bytes) * 100.0 / 1e6
    );
    assert!(now_bytes * 10 < before_bytes);
}
