//! The console's static files: htmx and its SSE extension (vendored, see
//! `assets/vendor/VENDOR.md`), `console.js`, `console.css` and the icon. They are embedded
//! in the binary with `include_bytes!` and served as `/console/assets/<name>.<hash8>.<ext>`,
//! `immutable`: a new version has a new name. Nothing is read from disk or fetched.

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

/// One embedded file.
#[derive(Debug)]
pub struct Asset {
    /// The name it is served under (`htmx.1a2b3c4d.js`).
    pub served_name: String,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub bytes: &'static [u8],
}

impl Asset {
    fn new(stem: &str, ext: &str, content_type: &'static str, bytes: &'static [u8]) -> Self {
        let digest = hex::encode(Sha256::digest(bytes));
        Self {
            served_name: format!("{stem}.{}.{ext}", &digest[..8]),
            content_type,
            bytes,
        }
    }

    /// The path it is served at.
    pub fn url(&self) -> String {
        format!("{}/assets/{}", crate::BASE, self.served_name)
    }
}

/// The five assets, by role.
#[derive(Debug)]
pub struct Assets {
    /// htmx itself.
    pub htmx: Asset,
    /// The SSE extension of htmx.
    pub sse: Asset,
    /// The console's own script.
    pub js: Asset,
    /// The console's style sheet.
    pub css: Asset,
    /// The icon.
    pub icon: Asset,
}

/// htmx, as vendored (see `VENDOR.md`).
pub const HTMX_JS: &[u8] = include_bytes!("../assets/vendor/htmx-2.0.11.min.js");
/// htmx-ext-sse, as vendored.
pub const HTMX_SSE_JS: &[u8] = include_bytes!("../assets/vendor/htmx-ext-sse-2.2.4.min.js");
const CONSOLE_JS: &[u8] = include_bytes!("../assets/console.js");
const CONSOLE_CSS: &[u8] = include_bytes!("../assets/console.css");
const ICON_SVG: &[u8] = include_bytes!("../assets/icon.svg");

/// The assets, named once per process.
pub static ASSETS: LazyLock<Assets> = LazyLock::new(|| Assets {
    htmx: Asset::new("htmx", "js", "text/javascript; charset=utf-8", HTMX_JS),
    sse: Asset::new(
        "htmx-ext-sse",
        "js",
        "text/javascript; charset=utf-8",
        HTMX_SSE_JS,
    ),
    js: Asset::new(
        "console",
        "js",
        "text/javascript; charset=utf-8",
        CONSOLE_JS,
    ),
    css: Asset::new("console", "css", "text/css; charset=utf-8", CONSOLE_CSS),
    icon: Asset::new("icon", "svg", "image/svg+xml", ICON_SVG),
});

impl Assets {
    fn all(&self) -> [&Asset; 5] {
        [&self.htmx, &self.sse, &self.js, &self.css, &self.icon]
    }

    /// The asset served under `name`.
    pub fn find(&self, name: &str) -> Option<&Asset> {
        self.all().into_iter().find(|a| a.served_name == name)
    }
}

/// `GET /console/assets/{name}`.
pub async fn serve(Path(name): Path<String>) -> Response {
    match ASSETS.find(&name) {
        Some(asset) => {
            let mut r = asset.bytes.into_response();
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            );
            h.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=31536000, immutable"),
            );
            r
        }
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `VENDOR.md` lists the SHA-256 of each vendored file; the embedded bytes match.
    #[test]
    fn vendored_files_match_their_recorded_hashes() {
        let vendor = include_str!("../assets/vendor/VENDOR.md");
        for (file, bytes) in [
            ("htmx-2.0.11.min.js", HTMX_JS),
            ("htmx-ext-sse-2.2.4.min.js", HTMX_SSE_JS),
        ] {
            let line = vendor
                .lines()
                .find(|l| l.contains(file))
                .unwrap_or_else(|| panic!("VENDOR.md does not list {file}"));
            let digest = hex::encode(Sha256::digest(bytes));
            assert!(
                line.contains(&digest),
                "{file}: VENDOR.md says `{line}`, the file hashes to {digest}"
            );
        }
    }

    #[test]
    fn names_carry_the_hash_and_are_found() {
        let a = &ASSETS;
        assert!(a.htmx.served_name.starts_with("htmx."));
        assert!(a.css.served_name.ends_with(".css"));
        assert_eq!(a.css.served_name.len(), "console.12345678.css".len());
        assert!(a.find(&a.js.served_name).is_some());
        assert!(a.find("console.js").is_none());
    }

    #[test]
    fn the_console_script_stays_small() {
        let lines = CONSOLE_JS.iter().filter(|b| **b == b'\n').count();
        assert!(lines <= 200, "console.js has {lines} lines (at most 200)");
    }
}
