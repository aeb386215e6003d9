//! The test PostgreSQL server: `BEIGE_TEST_POSTGRES_URL`, the URL `scripts/setup-postgres`
//! prints (a cluster of the test run's own on a Unix socket). Tests that need it skip
//! without it, printing why — unless `BEIGE_REQUIRE_POSTGRES=1` (CI), which fails them.

/// The server's URL (its database `beige`), or `None` after printing why the caller
/// skips. Panics when `BEIGE_REQUIRE_POSTGRES=1` and there is none.
pub fn url() -> Option<String> {
    if let Some(url) = std::env::var("BEIGE_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    {
        return Some(url);
    }
    assert!(
        std::env::var("BEIGE_REQUIRE_POSTGRES").as_deref() != Ok("1"),
        "BEIGE_REQUIRE_POSTGRES=1 but BEIGE_TEST_POSTGRES_URL is not set: run \
         scripts/setup-postgres and export the URL it prints"
    );
    eprintln!(
        "skipped: no PostgreSQL server (set BEIGE_TEST_POSTGRES_URL; scripts/setup-postgres starts one)"
    );
    None
}

/// `url` with its database replaced by `database` (the query string, with `host=`, kept).
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let start = base.find("://").map_or(0, |i| i + 3);
    let end = base[start..].find('/').map_or(base.len(), |i| start + i);
    let mut out = format!("{}/{database}", &base[..end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}
