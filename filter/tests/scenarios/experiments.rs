//! Native scenario tests of experiment arms: assignment, the arm header, and each arm's view.

use prewarm_core::experiment::{Arm, ArmRouting, ArmSettings, Experiment, Unit};
use prewarm_core::wire::{RoutingTable, Signal};

use prewarm_filter::config::{FilterConfig, IdentityConfig};
use prewarm_filter::host::fake::FakeHost;
use prewarm_filter::host::Metric;
use prewarm_filter::worker::Worker;

use crate::requests::{chat_body, send, table, template};

const ARM: &str = "x-prewarm-arm";
const ENDPOINT: &str = "x-gateway-destination-endpoint";

fn experiment(cold: ArmSettings) -> Experiment {
    Experiment {
        id: "exp".into(),
        unit: Unit::User,
        arms: vec![
            Arm {
                name: "warm".into(),
                weight: 0.5,
                settings: ArmSettings::default(),
            },
            Arm {
                name: "other".into(),
                weight: 0.5,
                settings: cold,
            },
        ],
        release: None,
    }
}

/// Two routable pods, one warming, and the experiment.
fn experiment_table(e: Experiment) -> RoutingTable {
    let mut t = table(&[("p1", "127.0.0.1:1001", &[]), ("p2", "127.0.0.1:1002", &[])]);
    let mut warming = table(&[("p3", "127.0.0.1:1003", &[])]);
    t.warming = std::mem::take(&mut warming.pods);
    t.experiment = Some(e);
    t
}

fn header(host: &FakeHost, name: &str) -> Option<String> {
    host.header(name).map(|v| String::from_utf8(v).unwrap())
}

/// Sends a request as `user` (with the client's own arm header) whose system prompt starts with
/// `system`; returns (arm, endpoint).
fn request_as(
    host: &FakeHost,
    worker: &Worker,
    user: &str,
    system: &str,
) -> (Option<String>, Option<String>) {
    let body = chat_body("m", &format!("{system} {}", template()), "q");
    send(
        host,
        worker,
        "/v1/chat/completions",
        &[("x-prewarm-user", user.as_bytes()), (ARM, b"exp/warm")],
        &body,
    );
    (header(host, ARM), header(host, ENDPOINT))
}

#[test]
fn every_request_gets_its_users_arm_whatever_arm_header_the_client_sent() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let e = experiment(ArmSettings::default());
    worker.table.install(7, experiment_table(e.clone()));
    let mut arms = std::collections::BTreeSet::new();
    for u in 0..40 {
        let user = format!("user-{u}");
        let expected = e.header_value(e.arm_of(user.as_bytes()));
        for q in ["a", "b"] {
            let (arm, endpoint) = request_as(&host, &worker, &user, q);
            assert_eq!(arm, expected, "{user}: the unit's arm, never the client's");
            assert!(endpoint.is_some());
        }
        arms.insert(expected);
    }
    assert_eq!(arms.len(), 2, "both arms have users");
    assert_eq!(host.metric(Metric::ArmAssigned), 80);
}

#[test]
fn without_an_experiment_a_client_arm_header_is_removed_and_none_is_set() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    worker
        .table
        .install(7, table(&[("p1", "127.0.0.1:1001", &[])]));
    let (arm, endpoint) = request_as(&host, &worker, "alice", "q");
    assert_eq!(arm, None);
    assert_eq!(endpoint.as_deref(), Some("127.0.0.1:1001"));
    // a request the filter does not inspect loses it too
    host.set_request(
        &[(":method", b"GET"), (":path", b"/"), (ARM, b"exp/x")],
        b"",
    );
    prewarm_filter::request::RequestFlow::default().on_headers(&host, &worker, true);
    assert_eq!(host.header(ARM), None);
}

#[test]
fn the_arm_without_warmup_also_routes_to_warming_pods_and_the_other_never_does() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let cold = ArmSettings {
        warmup: false,
        ..ArmSettings::default()
    };
    worker.table.install(7, experiment_table(experiment(cold)));
    let (mut warm_pods, mut cold_pods) = (Vec::new(), Vec::new());
    for u in 0..60 {
        let (arm, endpoint) = request_as(&host, &worker, &format!("user-{u}"), &format!("{u}"));
        let pod = endpoint.unwrap().split(',').next().unwrap().to_string();
        match arm.as_deref() {
            Some("exp/warm") => warm_pods.push(pod),
            Some("exp/other") => cold_pods.push(pod),
            other => panic!("{other:?}"),
        }
    }
    assert!(!warm_pods.contains(&"127.0.0.1:1003".to_string()));
    assert!(
        cold_pods.contains(&"127.0.0.1:1003".to_string()),
        "{cold_pods:?}"
    );
}

#[test]
fn the_arm_with_routing_off_is_left_to_envoy() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let off = ArmSettings {
        routing: ArmRouting::Off,
        ..ArmSettings::default()
    };
    worker.table.install(7, experiment_table(experiment(off)));
    for u in 0..30 {
        let (arm, endpoint) = request_as(&host, &worker, &format!("user-{u}"), "q");
        match arm.as_deref() {
            Some("exp/warm") => assert!(endpoint.is_some()),
            Some("exp/other") => assert_eq!(endpoint, None, "no endpoint header"),
            other => panic!("{other:?}"),
        }
    }
    assert!(host.metric(Metric::UnroutedArmOff) > 0);
}

#[test]
fn without_a_user_the_tenant_then_the_connection_is_the_unit() {
    let config = FilterConfig {
        identity: IdentityConfig {
            user_from_body: false,
            ..IdentityConfig::default()
        },
        ..FilterConfig::default()
    };
    let worker = Worker::new(config);
    let e = experiment(ArmSettings::default());
    worker.table.install(7, experiment_table(e.clone()));
    let body = chat_body("m", &template(), "q");

    let host = FakeHost::new();
    send(
        &host,
        &worker,
        "/v1/chat/completions",
        &[("x-prewarm-tenant", b"acme")],
        &body,
    );
    assert_eq!(header(&host, ARM), e.header_value(e.arm_of(b"acme")));

    let id = 77u64.to_le_bytes();
    host.properties
        .borrow_mut()
        .insert("connection.id".into(), id.to_vec());
    send(&host, &worker, "/v1/chat/completions", &[], &body);
    assert_eq!(header(&host, ARM), e.header_value(e.arm_of(&id)));

    host.properties.borrow_mut().clear();
    send(&host, &worker, "/v1/chat/completions", &[], &body);
    assert_eq!(header(&host, ARM), None, "no unit: no arm");
    assert!(
        header(&host, ENDPOINT).is_some(),
        "and routed as without one"
    );
    assert_eq!(host.metric(Metric::ArmNoUnit), 1);
}

#[test]
fn a_tenant_experiment_assigns_by_tenant_alone() {
    let worker = Worker::new(FilterConfig::default());
    let e = Experiment {
        unit: Unit::Tenant,
        ..experiment(ArmSettings::default())
    };
    worker.table.install(7, experiment_table(e.clone()));
    let body = chat_body("m", &template(), "q");
    let host = FakeHost::new();
    host.properties
        .borrow_mut()
        .insert("connection.id".into(), 77u64.to_le_bytes().to_vec());
    // Every user of a tenant gets the tenant's arm, whatever their own would be.
    let tenants: Vec<String> = (0..40).map(|t| format!("tenant-{t}")).collect();
    let arms: Vec<_> = tenants.iter().map(|t| e.arm_of(t.as_bytes())).collect();
    assert!(arms.contains(&0) && arms.contains(&1), "both arms drawn");
    for (tenant, arm) in tenants.iter().zip(&arms) {
        for user in ["u-1", "u-2", "u-3"] {
            send(
                &host,
                &worker,
                "/v1/chat/completions",
                &[
                    ("x-prewarm-user", user.as_bytes()),
                    ("x-prewarm-tenant", tenant.as_bytes()),
                ],
                &body,
            );
            assert_eq!(header(&host, ARM), e.header_value(*arm), "{tenant} {user}");
        }
    }
    // A user without a tenant (even on a connection) gets no arm, counted, and is routed.
    send(
        &host,
        &worker,
        "/v1/chat/completions",
        &[("x-prewarm-user", b"u-1")],
        &body,
    );
    assert_eq!(header(&host, ARM), None);
    assert!(header(&host, ENDPOINT).is_some());
    assert_eq!(host.metric(Metric::ArmNoUnit), 1);
}

/// The first of `user-0..` whose arm is `arm` (`<experiment>/<arm>`).
fn user_of(e: &Experiment, arm: &str) -> String {
    (0..100)
        .map(|u| format!("user-{u}"))
        .find(|u| e.header_value(e.arm_of(u.as_bytes())).as_deref() == Some(arm))
        .unwrap()
}

/// Three similar prompts (the filter's default streak, which makes a prefill signal) from
/// `user` on `system`'s template; returns the signals queued for the gateway.
fn streak(host: &FakeHost, worker: &Worker, user: &str, system: &str) -> Vec<Signal> {
    for q in 0..3 {
        let body = chat_body("m", &format!("{system} {}", template()), &format!("q {q}"));
        send(
            host,
            worker,
            "/v1/chat/completions",
            &[("x-prewarm-user", user.as_bytes())],
            &body,
        );
    }
    worker.queue.take(host).records
}

#[test]
fn an_arm_without_warmup_keeps_its_prompts_from_the_gateways_warm_ups() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let cold = ArmSettings {
        warmup: false,
        ..ArmSettings::default()
    };
    let e = experiment(cold);
    worker.table.install(7, experiment_table(e.clone()));
    let other = streak(&host, &worker, &user_of(&e, "exp/other"), "Acme");
    assert!(other.is_empty(), "withheld");
    assert!(host.metric(Metric::ArmSignalsWithheld) >= 1);
    let warm = streak(&host, &worker, &user_of(&e, "exp/warm"), "Acme");
    assert!(!warm.is_empty(), "the warm arm's go out");
}

#[test]
fn an_arm_without_keep_warm_marks_its_prefill_signals_and_the_other_does_not() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let no_keep = ArmSettings {
        keep_warm: false,
        ..ArmSettings::default()
    };
    let e = experiment(no_keep);
    worker.table.install(7, experiment_table(e.clone()));
    let keep_warm_of = |user: &str, system: &str| {
        streak(&host, &worker, user, system)
            .iter()
            .filter_map(|s| match s {
                Signal::Prefill(p) => Some(p.keep_warm),
                _ => None,
            })
            .collect::<Vec<bool>>()
    };
    assert_eq!(keep_warm_of(&user_of(&e, "exp/other"), "Acme"), vec![false]);
    assert_eq!(keep_warm_of(&user_of(&e, "exp/warm"), "Zenith"), vec![true]);
}
