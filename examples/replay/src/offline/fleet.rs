//! The simulated fleet: podsim pod models in virtual time, created cold, restarted cold, and
//! every adapter registered on every pod (as with vLLM's filesystem resolver or adapters
//! registered at start), so any pod can serve any adapter; which adapters hold GPU slots and
//! the host cache is podsim's LRU, or what a policy's touches make it.

use podsim::{AdapterSpec, Admission, LatencyProfile, Pod, PodConfig, RequestError, RequestSpec};
use prewarm_core::PlacementCandidate;

use crate::scenario::FleetSpec;

/// One pod of the fleet.
#[derive(Debug)]
pub struct SimPod {
    pub id: String,
    pub pod: Pod,
}

/// The pods, in join order (a pod's index never changes).
#[derive(Debug)]
pub struct Fleet {
    config: PodConfig,
    adapters: Vec<AdapterSpec>,
    pub pods: Vec<SimPod>,
}

/// Why the fleet could not be built.
pub type FleetError = Vec<String>;

impl Fleet {
    /// `spec.pods` cold pods with `adapters` registered.
    pub fn new(spec: &FleetSpec, adapters: &[String]) -> Result<Self, FleetError> {
        let latency =
            LatencyProfile::parse(&spec.profile).map_err(|e| vec![format!("profile: {e}")])?;
        let config = PodConfig {
            max_model_len: 1 << 20,
            num_gpu_blocks: spec.kv_blocks,
            enable_lora: true,
            max_loras: spec.max_loras,
            max_cpu_loras: spec.max_cpu_loras,
            max_lora_rank: spec.adapter_rank.max(16),
            latency,
            prefill_compute: spec.prefill_compute,
            ..PodConfig::default()
        };
        let problems = config.validate();
        if !problems.is_empty() {
            return Err(problems);
        }
        let adapters = adapters
            .iter()
            .map(|name| AdapterSpec {
                name: name.clone(),
                path: format!("/adapters/{name}"),
                rank: spec.adapter_rank,
                pinned: false,
            })
            .collect();
        let mut fleet = Self {
            config,
            adapters,
            pods: Vec::new(),
        };
        for _ in 0..spec.pods {
            fleet.add_pod()?;
        }
        Ok(fleet)
    }

    pub fn config(&self) -> &PodConfig {
        &self.config
    }

    pub fn base_model(&self) -> &str {
        &self.config.served_model_name
    }

    fn cold_pod(&self) -> Result<Pod, FleetError> {
        let mut pod = Pod::new(self.config.clone())?;
        for a in &self.adapters {
            pod.load_adapter(a.clone(), true)
                .map_err(|e| vec![format!("adapter {}: {e}", a.name)])?;
        }
        Ok(pod)
    }

    /// A cold pod joins; returns its index.
    pub fn add_pod(&mut self) -> Result<usize, FleetError> {
        let index = self.pods.len();
        let pod = self.cold_pod()?;
        self.pods.push(SimPod {
            id: format!("pod-{index}"),
            pod,
        });
        Ok(index)
    }

    /// Pod `index` restarts: same identity, cold cache, no adapter in a slot.
    pub fn restart(&mut self, index: usize) -> Result<(), FleetError> {
        let pod = self.cold_pod()?;
        if let Some(p) = self.pods.get_mut(index) {
            p.pod = pod;
        }
        Ok(())
    }

    /// Whether `adapter` holds a GPU slot on pod `index` now.
    pub fn adapter_in_slot(&self, index: usize, adapter: &str) -> bool {
        self.pods
            .get(index)
            .is_some_and(|p| p.pod.gpu_adapters().contains(&adapter))
    }

    /// The most cached tokens a request for `adapter` (`None`: the base model) with
    /// `canonical_prompt` would get on any pod now, as admission counts them (the last token
    /// never cached). No side effects: what a router that saw every cache could have had.
    pub fn best_hit_tokens(&self, adapter: Option<&str>, canonical_prompt: &str) -> usize {
        let Some(first) = self.pods.first() else {
            return 0;
        };
        let hashes = first.pod.prompt_hashes(adapter, canonical_prompt);
        let prompt_tokens = prewarm_core::tokens::token_count(canonical_prompt.len());
        self.pods
            .iter()
            .map(|p| p.pod.would_hit_of(&hashes, prompt_tokens))
            .max()
            .unwrap_or(0)
    }

    /// Submits a request to pod `index` at `now_s`.
    pub fn serve(
        &mut self,
        index: usize,
        now_s: f64,
        spec: &RequestSpec,
    ) -> Result<Admission, RequestError> {
        match self.pods.get_mut(index) {
            Some(p) => p.pod.submit(now_s, spec),
            None => Err(RequestError::UnknownModel {
                model: spec.model.clone(),
            }),
        }
    }

    /// Placement candidates (equal weights) for the pods `members`, in that order.
    pub fn candidates(&self, members: &[usize]) -> Vec<PlacementCandidate<'_>> {
        members
            .iter()
            .filter_map(|&i| {
                self.pods
                    .get(i)
                    .map(|p| PlacementCandidate::new(&p.id, 1.0))
            })
            .collect()
    }

    /// The adapter spec of `name`.
    pub fn adapter(&self, name: &str) -> Option<&AdapterSpec> {
        self.adapters.iter().find(|a| a.name == name)
    }
}
