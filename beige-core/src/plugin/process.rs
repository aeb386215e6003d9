//! What a plugin process on the host starts with: the gateway's environment as a lookup
//! and the `PATH` it gets. A leaf: external plugins, command tools and the loader use it,
//! and it uses nothing of the crate.

/// The gateway's own environment, as a lookup.
pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// `PATH` for plugin processes: the gateway's, else a standard one.
pub(super) fn base_path() -> String {
    process_env("PATH")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".to_string())
}
