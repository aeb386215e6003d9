//! Who a call comes from: [`Principal`], re-exported as `policy::Principal`. It lives in
//! beige-client, so that the tools, which carry the principal of a call in their
//! `ToolContext`, need not depend on `policy`.

pub use beige_client::Principal;

/// How the audit (and the MCP server's session keys) name a principal: `owner` for the
/// gateway's token (the only token until users and roles exist), `<channel>:<id>` for a
/// channel's user.
pub(crate) fn audit_name(principal: &Principal) -> String {
    match principal {
        Principal::ApiToken => "owner".to_string(),
        Principal::User { channel, id } => format!("{channel}:{id}"),
        Principal::Sandbox => "sandbox".to_string(),
        Principal::Embedder => "embedder".to_string(),
        Principal::Person { name, .. } => name.clone(),
        _ => "unverified".to_string(),
    }
}
