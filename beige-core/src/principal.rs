//! Who a call comes from: [`Principal`], re-exported as `policy::Principal`. It lives in
//! beige-client, so that the tools, which carry the principal of a call in their
//! `ToolContext`, need not depend on `policy`.

pub use beige_client::Principal;
