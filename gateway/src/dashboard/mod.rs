//! The dashboard: static assets embedded in the binary and served read-only at `/` on the admin
//! listener (GET only). The page holds no data and is served without a token; it reads the admin
//! API (`/admin/pods`, `/admin/pods/{id}`, `/admin/adapters/heatmap`, `/admin/prompts`,
//! `/admin/pods/{id}/plan`, `/admin/experiments`, `/admin/experiments/{id}`) like any other client
//! and the policy decision counters of `/metrics`, and refreshes on its own; nothing is fetched
//! from outside the gateway. See `docs/dashboard.md`.

use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS,
};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// One embedded asset: its path under `/`, its content type and its bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const ASSETS: [Asset; 3] = [
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_str!("../../assets/dashboard/index.html"),
    },
    Asset {
        path: "/dashboard/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../../assets/dashboard/app.js"),
    },
    Asset {
        path: "/dashboard/style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("../../assets/dashboard/style.css"),
    },
];

/// The browser may load and fetch from the gateway only (inline styles: the heatmap's colours).
const POLICY: &str = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
    connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The dashboard's routes (GET only), to merge into the API router.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ASSETS.iter().fold(Router::new(), |router, asset| {
        let (content_type, body) = (asset.content_type, asset.body);
        router.route(
            asset.path,
            get(move || async move {
                (
                    [
                        (CONTENT_TYPE, content_type),
                        (CACHE_CONTROL, "no-cache"),
                        (CONTENT_SECURITY_POLICY, POLICY),
                        (X_CONTENT_TYPE_OPTIONS, "nosniff"),
                    ],
                    body,
                )
                    .into_response()
            }),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::ASSETS;

    #[test]
    fn the_page_references_only_embedded_assets() {
        let page = ASSETS[0].body;
        for asset in &ASSETS[1..] {
            assert!(page.contains(asset.path), "{} not referenced", asset.path);
        }
        for asset in &ASSETS {
            assert!(
                !asset.body.contains("http://"),
                "{} links outside",
                asset.path
            );
            assert!(
                !asset.body.contains("https://"),
                "{} links outside",
                asset.path
            );
        }
    }
}
