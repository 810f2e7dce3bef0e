//! Executing the gateway's decisions on a simulated pod, as its async shell does on a real one:
//! a LoRA `Load` reads the adapter into the host cache (podsim `load_adapter`), a `Touch` is a
//! one-token request with the adapter, a prefix prefill is a completion of the prefix text with
//! `max_tokens: 1`. `Unload` only updates the model: every adapter stays registered on podsim
//! pods (see [`crate::offline::fleet`]). Each returns when it completes (model seconds) and the
//! prompt tokens the pod had to prefill for it. Prompts are the gateway engine's own
//! (`prefill_prompt`: the prefix and one token more, so its last block is cached; a touch is the
//! same with an empty prefix).

use podsim::RequestSpec;
use prewarm_gateway::engine::prefill_prompt;
use prewarm_gateway::policy::LoraDecision;

use super::super::fleet::Fleet;

/// What executing something cost.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Executed {
    /// When it completed, model seconds.
    pub done_s: f64,
    /// Prompt tokens the pod prefilled (not served from its cache).
    pub prefill_tokens: u64,
    pub ok: bool,
}

/// Sends the gateway's prefill of `text` for `model` (`max_tokens: 1`) to pod `pod`.
pub fn prefill(fleet: &mut Fleet, pod: usize, model: &str, text: &str, now_s: f64) -> Executed {
    let spec = RequestSpec {
        model: model.to_string(),
        canonical_prompt: prefill_prompt(text),
        max_tokens: Some(1),
    };
    match fleet.serve(pod, now_s, &spec) {
        Ok(a) => Executed {
            done_s: a.first_token_at,
            prefill_tokens: (a.prompt_tokens - a.cached_tokens) as u64,
            ok: true,
        },
        Err(_) => Executed {
            done_s: now_s,
            prefill_tokens: 0,
            ok: false,
        },
    }
}

/// Executes one LoRA decision on pod `pod`.
pub fn lora_decision(
    fleet: &mut Fleet,
    pod: usize,
    decision: &LoraDecision,
    now_s: f64,
) -> Executed {
    match decision {
        LoraDecision::Load(name) => {
            let in_host = fleet
                .pods
                .get(pod)
                .is_some_and(|p| p.pod.host_adapters().contains(&name.as_str()));
            let spec = fleet.adapter(name).cloned();
            match (in_host, spec, fleet.pods.get_mut(pod)) {
                (true, _, _) => Executed {
                    done_s: now_s,
                    prefill_tokens: 0,
                    ok: true,
                },
                (false, Some(spec), Some(p)) => match p.pod.load_adapter(spec, true) {
                    Ok(cost) => Executed {
                        done_s: now_s + cost,
                        prefill_tokens: 0,
                        ok: true,
                    },
                    Err(_) => Executed::default(),
                },
                _ => Executed::default(),
            }
        }
        LoraDecision::Touch(name) => prefill(fleet, pod, name, "", now_s),
        LoraDecision::Unload(_) => Executed {
            done_s: now_s,
            prefill_tokens: 0,
            ok: true,
        },
    }
}
