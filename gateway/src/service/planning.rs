//! The warm-up plan as the API (`GET /admin/pods/{id}/plan`) and the `plan` command print it; the
//! plan itself is the fleet core's ([`crate::policy::fleet::Fleet::plan_for`]).

use serde::Serialize;

use crate::policy::WarmupPlan;

/// A plan as the API and the `plan` command print it: prefix keys in their display form
/// (`<model seed hex>-<last block hex>`, as `GET /admin/prompts` lists them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanView {
    pub pod: String,
    pub adapters: Vec<String>,
    pub first_tier: Vec<String>,
    pub second_tier: Vec<String>,
    /// Prefixes that move to the pod but are left to lazy warm-up.
    pub lazy: usize,
    /// Hot prefixes examined.
    pub considered: usize,
}

impl From<&WarmupPlan> for PlanView {
    fn from(plan: &WarmupPlan) -> Self {
        Self {
            pod: plan.pod.clone(),
            adapters: plan.adapters.clone(),
            first_tier: plan.first_tier.iter().map(|k| k.to_string()).collect(),
            second_tier: plan.second_tier.iter().map(|k| k.to_string()).collect(),
            lazy: plan.lazy.len(),
            considered: plan.considered,
        }
    }
}
