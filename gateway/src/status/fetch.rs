//! Reading the admin API for [`super::model::Snapshot`]: the pod list, each pod's detail and
//! plan, the residency heatmap, the adapter records and the prompt pool's top entries.

use serde::de::DeserializeOwned;

use super::model::{
    AdapterList, HeatmapReply, PodDetailReply, PodListReply, PodSnapshot, PromptsReply, Snapshot,
};

/// Prompts read to weigh adapters by hotness (the API's largest `k`).
const HOTNESS_K: usize = 1000;

/// Why the API could not be read: the URL and the problem.
#[derive(Debug, thiserror::Error)]
#[error("{url}: {problem}")]
pub struct FetchError {
    pub url: String,
    pub problem: String,
}

async fn get<T: DeserializeOwned>(client: &reqwest::Client, url: String) -> Result<T, FetchError> {
    let fail = |problem: String| FetchError {
        url: url.clone(),
        problem,
    };
    let reply = client
        .get(&url)
        .send()
        .await
        .map_err(|e| fail(e.to_string()))?;
    let status = reply.status();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return Err(fail(format!(
            "HTTP {status}: pass the gateway's read token (--token or PREWARM_READ_TOKEN)"
        )));
    }
    if !status.is_success() {
        return Err(fail(format!("HTTP {status}")));
    }
    reply
        .json::<T>()
        .await
        .map_err(|e| fail(format!("unexpected reply: {e}")))
}

/// Everything the view needs, read from the gateway at `base` (no trailing slash).
pub async fn snapshot(client: &reqwest::Client, base: &str) -> Result<Snapshot, FetchError> {
    let list: PodListReply = get(client, format!("{base}/admin/pods")).await?;
    let heatmap: HeatmapReply = get(client, format!("{base}/admin/adapters/heatmap")).await?;
    let prompts: PromptsReply = get(client, format!("{base}/admin/prompts?k={HOTNESS_K}")).await?;
    let adapters: AdapterList = get(client, format!("{base}/admin/adapters")).await?;
    let mut pods = Vec::with_capacity(list.pods.len());
    for summary in list.pods {
        let id = encode_segment(&summary.id);
        // A pod removed between the list and its detail is shown without them.
        let detail: Option<PodDetailReply> =
            get(client, format!("{base}/admin/pods/{id}")).await.ok();
        let plan = get(client, format!("{base}/admin/pods/{id}/plan"))
            .await
            .ok();
        pods.push(PodSnapshot {
            summary,
            detail,
            plan,
        });
    }
    Ok(Snapshot {
        pods,
        heatmap,
        prompts,
        adapters: adapters.adapters,
    })
}

/// Percent-encodes a path segment (pod ids are free text in the API).
fn encode_segment(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::encode_segment;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode_segment("pod-a_1.x~"), "pod-a_1.x~");
        assert_eq!(encode_segment("a/b c"), "a%2Fb%20c");
    }
}
