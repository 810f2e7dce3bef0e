//! The configuration as an operator writes it: defaults, every bad value named, unknown keys
//! refused with the accepted ones, the rules between sections.

use prewarm_core::Endpoint;

use super::*;

#[test]
fn empty_configuration_is_the_defaults() {
    let c = FilterConfig::from_json(b"").unwrap();
    assert_eq!(c, FilterConfig::default());
    assert_eq!(c.signals.triggers.similar_prompts, 3);
    assert_eq!(c.requests.max_body_bytes, 1 << 20);
    assert_eq!(
        c.requests.endpoint_of("/v1/chat/completions?x=1"),
        Some(Endpoint::ChatCompletions)
    );
    assert_eq!(c.requests.endpoint_of("/v1/models"), None);
}

#[test]
fn bad_values_name_field_value_and_rule() {
    let e = FilterConfig::from_json(
        br#"{"tick_period_ms":0,"endpoint_header":"X Bad","triggers":{"similarity_threshold":2.0}}"#,
    )
    .unwrap_err();
    assert!(e.contains(&"tick_period_ms: 0: must be between 10 and 60000".to_string()));
    assert!(e
        .iter()
        .any(|p| p.starts_with("endpoint_header: \"X Bad\":")));
    assert!(e
        .iter()
        .any(|p| p.starts_with("triggers.similarity_threshold: 2:")));
}

#[test]
fn a_configuration_the_host_could_not_give_is_not_the_defaults() {
    assert!(matches!(
        FilterConfig::from_plugin(Err(())),
        Err(Refusal::Unreadable(_))
    ));
    assert_eq!(
        FilterConfig::from_plugin(Ok(None)),
        Ok(FilterConfig::default())
    );
    assert!(matches!(
        FilterConfig::from_plugin(Ok(Some(b"{".to_vec()))),
        Err(Refusal::Invalid(_))
    ));
}

#[test]
fn batch_limits_agree_with_the_gateway_by_construction() {
    let e = FilterConfig::from_json(br#"{"max_batch_bytes":4194305}"#).unwrap_err();
    assert!(
        e[0].starts_with("max_batch_bytes: 4194305: must be between 4096 and 4194304"),
        "{e:?}"
    );
    let e = FilterConfig::from_json(br#"{"max_batch_bytes":65536,"max_signal_bytes":65536}"#)
        .unwrap_err();
    assert!(
        e[0].starts_with("max_signal_bytes: 65536: must be between 256 and "),
        "{e:?}"
    );
    assert!(FilterConfig::from_json(br#"{"max_pending_bytes":1024}"#).is_err());
}

#[test]
fn shared_prompt_and_credential_settings_are_checked_by_name() {
    let e = FilterConfig::from_json(
        br#"{"triggers":{"shared_prompts":1},"shared_prompt_slots":0,
            "shared_prompt_tally_bytes":10,"credential_headers":["Authorization"],
            "credential_key":"short-secret"}"#,
    )
    .unwrap_err();
    for field in [
        "triggers.shared_prompts: 1:",
        "shared_prompt_slots: 0:",
        "shared_prompt_tally_bytes: 10:",
        "credential_headers: \"Authorization\":",
        "credential_key: (hidden):",
    ] {
        assert!(e.iter().any(|p| p.starts_with(field)), "{field} in {e:?}");
    }
    assert!(
        !e.iter().any(|p| p.contains("short-secret")),
        "a key is never echoed"
    );
    let c = FilterConfig::from_json(br#"{"triggers":{"shared_prompts":null}}"#).unwrap();
    assert_eq!(c.signals.triggers.shared_prompt_threshold(), 3);
}

#[test]
fn the_endpoint_header_owner_is_checked_by_name() {
    assert_eq!(
        FilterConfig::default().routing.endpoint_header_owner,
        EndpointHeaderOwner::Prewarm
    );
    let c = FilterConfig::from_json(br#"{"endpoint_header_owner":"external","routing":false}"#)
        .unwrap();
    assert_eq!(
        c.routing.endpoint_header_owner,
        EndpointHeaderOwner::External
    );
    let e =
        FilterConfig::from_json(br#"{"endpoint_header_owner":"epp","routing":false}"#).unwrap_err();
    assert!(
        e[0].starts_with("endpoint_header_owner: \"epp\": unknown variant"),
        "{e:?}"
    );
    // the other router names the pod: a filter that also routes would fight it
    let e = FilterConfig::from_json(br#"{"endpoint_header_owner":"external"}"#).unwrap_err();
    assert_eq!(
        e,
        vec![
            "endpoint_header_owner: \"external\": needs \"routing\": false (the other \
              router names the pod; the filter only records it)"
                .to_string()
        ]
    );
}

#[test]
fn unknown_fields_and_wrong_types_are_refused_by_name() {
    let e = FilterConfig::from_json(br#"{"tick_period":5}"#).unwrap_err();
    assert!(e[0].contains("unknown field `tick_period`"), "{e:?}");
    let e = FilterConfig::from_json(br#"{"block_tokens":"x"}"#).unwrap_err();
    assert!(
        e[0].starts_with("block_tokens: \"x\": invalid type"),
        "{e:?}"
    );
    let e = FilterConfig::from_json(br#"{"block_tokens":48}"#).unwrap_err();
    assert!(e[0].starts_with("block_tokens: 48:"), "{e:?}");
}

#[test]
fn the_defaults_are_what_an_empty_object_reads_and_they_validate() {
    assert_eq!(FilterConfig::from_json(b"{}"), Ok(FilterConfig::default()));
    assert_eq!(FilterConfig::default().validate(), Vec::<String>::new());
}

#[test]
fn every_section_has_its_own_keys() {
    let keys = top_level_keys();
    let mut unique = keys.to_vec();
    unique.sort_unstable();
    unique.dedup();
    // a key in two sections would be read by the first alone
    assert_eq!(unique.len(), keys.len(), "{keys:?}");
    assert_eq!(keys.len(), 50, "{keys:?}");
    for key in [
        "routing",
        "embedding_cache",
        "triggers",
        "direct_pods",
        "source",
    ] {
        assert!(keys.contains(&key), "{key} in {keys:?}");
    }
}

#[test]
fn an_unknown_key_is_refused_with_every_accepted_key() {
    let e = FilterConfig::from_json(br#"{"tick_period_ms":5,"probe":1}"#).unwrap_err();
    assert_eq!(e.len(), 1, "{e:?}");
    let expected = e[0]
        .split_once("unknown field `probe`, expected one of ")
        .unwrap_or_else(|| panic!("{e:?}"))
        .1;
    // keys of several sections, the first and the last
    for key in [
        "`gateway_cluster`",
        "`max_batch_bytes`",
        "`block_tokens`",
        "`routing`",
        "`credential_key`",
        "`prefix_slots`",
        "`direct_takeover_after_ms`",
        "`embedding_cache`",
    ] {
        assert!(expected.contains(key), "{key} in {expected}");
    }
    assert_eq!(expected.matches('`').count(), 2 * top_level_keys().len());
    // straight from serde too (what the docs test reads)
    let e = serde_json::from_str::<FilterConfig>(r#"{"probe":1}"#).unwrap_err();
    assert!(e.to_string().contains("`shared_prefix`"), "{e}");
}

#[test]
fn a_misspelt_key_of_a_section_is_refused_by_name() {
    let e = FilterConfig::from_json(br#"{"direct_timeout":5}"#).unwrap_err();
    assert!(
        e[0].contains("unknown field `direct_timeout`, expected one of")
            && e[0].contains("`direct_timeout_ms`"),
        "{e:?}"
    );
    let e = FilterConfig::from_json(br#"{"embedding_cache":{"ttl":5}}"#).unwrap_err();
    assert!(
        e[0].starts_with("embedding_cache: {\"ttl\":5}: unknown field `ttl`, expected one of")
            && e[0].contains("`ttl_ms`"),
        "{e:?}"
    );
    let e = FilterConfig::from_json(br#"{"triggers":{"similar_prompt":3}}"#).unwrap_err();
    assert!(e[0].contains("unknown field `similar_prompt`"), "{e:?}");
    assert!(FilterConfig::from_json(b"[]").is_err());
}

#[test]
fn rules_between_sections_name_their_field() {
    let e = FilterConfig::from_json(
        br#"{"direct_host_header":"x-pod","endpoint_header":"x-pod",
            "max_prefix_tokens":65536,"direct_prefill_tokens_per_min":65536}"#,
    )
    .unwrap_err();
    assert_eq!(
        e,
        [
            "direct_host_header: \"x-pod\": must differ from endpoint_header",
            "direct_prefill_tokens_per_min: 65536: must be between 65537 and 1099511627776",
        ]
    );
}

#[test]
fn a_repeated_key_is_refused_by_name_at_every_level() {
    let e = FilterConfig::from_json(br#"{"tick_period_ms":500,"tick_period_ms":5}"#).unwrap_err();
    assert!(e[0].contains("duplicate field `tick_period_ms`"), "{e:?}");
    let e = FilterConfig::from_json(br#"{"embedding_cache":{"ttl_ms":5000,"ttl_ms":9000}}"#)
        .unwrap_err();
    assert!(e[0].contains("duplicate field `ttl_ms`"), "{e:?}");
}
