//! Planning a pod's warm-up from the fleet as it is: the candidates are the pods not known to be
//! down (up, or not checked yet: at a gateway restart every pod comes up in the same round, and
//! each should warm only its own share) plus the pod itself; its adapters are those placed on it
//! (pinned first, then by tier, then by name); its prefixes are the pool's hottest that move to
//! it, an adapter's prefixes placed within the adapter's scope ([`super::placement`]).

use prewarm_core::PlacementCandidate;

use super::action::Note;
use super::pod::PodHealth;
use super::Fleet;
use crate::policy::{
    plan_warmup_scoped, PlanScope, SemanticGroups, Tier, WarmupPlan, WarmupProgress,
};

/// Which pods count as placement candidates besides the planned one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Candidates {
    /// Pods not known to be down (the live service).
    Live,
    /// Every pod in the pool (the `plan` command, which checks no pod).
    All,
}

impl Fleet {
    /// The plan `pod_id` would get now; `None` when it is not in the pool.
    pub fn plan_for(&self, pod_id: &str, which: Candidates, now_ms: u64) -> Option<WarmupPlan> {
        self.pods.get(pod_id)?;
        let candidates: Vec<PlacementCandidate<'_>> = self
            .pods
            .values()
            .filter(|p| {
                p.shape.id == pod_id
                    || match which {
                        Candidates::All => true,
                        Candidates::Live => p.health != PodHealth::Down,
                    }
            })
            .map(|p| PlacementCandidate::new(&p.shape.id, p.shape.weight))
            .collect();
        let sets = self.replica_sets_among(&candidates);
        let mut adapters: Vec<(bool, Tier, &str)> = self
            .registry
            .iter()
            .filter(|r| {
                sets.get(&r.name)
                    .is_some_and(|pods| pods.iter().any(|p| p == pod_id))
            })
            .map(|r| (r.pinned, r.tier, r.name.as_str()))
            .collect();
        adapters.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(b.2)));
        let adapters: Vec<String> = adapters
            .into_iter()
            .map(|(_, _, n)| n.to_string())
            .collect();
        let hot = self.hot_prefixes(self.config.warmup.max_candidates);
        let scopes = self.adapter_scopes(&candidates, now_ms);
        let scope = PlanScope {
            scoped: &scopes,
            groups: &self.semantic_groups,
        };
        Some(plan_warmup_scoped(
            pod_id,
            &candidates,
            scope,
            &adapters,
            &hot,
            &self.config.warmup,
        ))
    }

    /// The pool's semantic groups, which plans read with `warmup.sampling = "groups"` (the
    /// gateway's prompt index sets them after each rebuild; without it every key is ungrouped).
    pub fn set_semantic_groups(&mut self, groups: SemanticGroups) {
        self.semantic_groups = groups;
    }

    /// Whether `pod_id`, found up by the gateway's first health round, had already served
    /// requests (its engine's success counter is above 0): it was taking traffic before this
    /// gateway process started — a gateway restart, not a join — so holding it out of the table
    /// until its first tier is re-warmed would only cost the routing of that traffic. It is
    /// warmed all the same (the gateway's KV model of it is empty). A pod whose engine exports no
    /// such counter (SGLang), or that joins later, waits for its first tier.
    pub fn served_before_the_gateway(&self, pod_id: &str) -> bool {
        !self.experiments.settled()
            && self
                .pods
                .get(pod_id)
                .and_then(|p| p.load.request_successes)
                .is_some_and(|n| n > 0)
    }

    /// Plans `pod_id`'s warm-up and starts it (its steps come out of [`Fleet::tick`]); a pod
    /// already admitted to the table in this epoch stays in it, and so does a pod that was
    /// serving before the gateway started ([`Fleet::served_before_the_gateway`]). Returns whether
    /// it started (the pod exists and is up).
    pub fn start_warmup(&mut self, pod_id: &str, now_ms: u64) -> bool {
        if self.pods.get(pod_id).map(|p| p.health) != Some(PodHealth::Up) {
            return false;
        }
        // The joining pod takes its replicas now, so its plan's scopes see it as their holder.
        self.refresh_placement(false, now_ms);
        let Some(plan) = self.plan_for(pod_id, Candidates::Live, now_ms) else {
            return false;
        };
        self.outputs.note(Note::Planned {
            pod: pod_id.to_string(),
            adapters: plan.adapters.len(),
            first_tier: plan.first_tier.len(),
            second_tier: plan.second_tier.len(),
            lazy: plan.lazy.len(),
        });
        self.outputs.decision("warmup", "plan", 1);
        let config = self.config.warmup.clone();
        let serving_already = self.served_before_the_gateway(pod_id);
        let Some(pod) = self.pods.get_mut(pod_id) else {
            return false;
        };
        let progress = match pod.warmup.previous.take() {
            Some(previous) => previous.restarted(plan, now_ms),
            None => WarmupProgress::start(plan, config, now_ms),
        };
        let at_once = progress.status(now_ms).first_tier_done_ms.is_some();
        pod.warmup.admitted = pod.warmup.routable(now_ms) || serving_already;
        if let Some(p) = pod.warmup.progress.as_mut() {
            p.pod_lost();
        }
        pod.warmup.progress = Some(progress);
        if at_once {
            // Nothing to warm before traffic: routable at once, a zero-length warm-up.
            self.outputs.note(Note::FirstTierDone {
                pod: pod_id.to_string(),
                seconds: 0.0,
            });
        }
        self.rebuild_table(now_ms);
        true
    }
}
