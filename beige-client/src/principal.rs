//! Who a call comes from: [`Principal`], set by a channel from its connection and
//! carried by a [`PromptRequest`](crate::PromptRequest) and a
//! [`ToolContext`](crate::ToolContext) (beige-core re-exports it as `policy::Principal`).

/// Who a call comes from, as the gateway saw the connection (never read from a payload).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Principal {
    /// Nobody the gateway could vouch for (the default).
    #[default]
    Unverified,
    /// A script in the agent's sandbox, over its tool socket.
    Sandbox,
    /// A user of a channel, by the channel's own id of them (Telegram: the user id).
    User {
        /// The channel, e.g. `telegram`.
        channel: String,
        /// The channel's id of the user.
        id: String,
    },
    /// A holder of the HTTP API's token.
    ApiToken,
    /// The program embedding the gateway, calling it in process.
    Embedder,
    /// A user of the gateway's `users` section, as the gateway authenticated them: a
    /// personal token, a console session, or a channel identity mapped to the user.
    Person {
        /// The user's name in `users`.
        name: String,
        /// How they authenticated (`token:<id>`, `console:<token id>`, `telegram:<id>`).
        via: String,
    },
}

impl Principal {
    /// A channel user.
    pub fn user(channel: impl Into<String>, id: impl Into<String>) -> Self {
        Principal::User {
            channel: channel.into(),
            id: id.into(),
        }
    }
}
