//! With `embeddings.model_dir` set, the gateway is not ready until the first prompt index is
//! built (a restored snapshot alone is not enough), and a model that cannot be loaded keeps it
//! unready with the reason in the index status. Without `model_dir` nothing changes.

use prewarm_gateway::config::GatewayConfig;
use prewarm_gateway::service::Gateway;

fn config(dir: &std::path::Path, model_dir: Option<std::path::PathBuf>) -> GatewayConfig {
    let mut config = GatewayConfig::default();
    config.state.dir = dir.join("state");
    config.embeddings.model_dir = model_dir;
    config
}

#[test]
fn readiness_waits_for_the_prompt_index() {
    let dir = tempfile::tempdir().unwrap();
    let plain = Gateway::new(config(dir.path(), None));
    plain.restore();
    assert!(plain.is_ready());
    assert!(plain.embeddings.is_none());

    // A folder without the model: the refresh fails, the gateway stays unready and says why.
    let gateway = Gateway::new(config(dir.path(), Some(dir.path().to_path_buf())));
    gateway.restore();
    assert!(!gateway.is_ready());
    let search = gateway.embeddings.clone().unwrap();
    assert!(search.refresh(Vec::new()).is_err());
    assert!(!gateway.is_ready());
    let status = search.status();
    assert!(!status.built);
    assert!(status.error.unwrap().contains("config.json"));
}
