//! `beige users …`: the people of a shared gateway (`docs/people.md`). `list` reads the
//! config's `users` section (roles and channel identities live there, edited like the
//! rest of the config); `token create|list|revoke` manage personal API tokens through
//! the running gateway, which keeps only their hashes. A token's secret is printed once,
//! by `create`, and never again.

use std::path::Path;

use anyhow::Result;
use beige_core::api::auth::{NewToken, Role, TokenInfo, TokenScope};
use beige_core::api::Admin as _;
use beige_core::home::BeigeHome;

use crate::client::Target;
use crate::Exit;

/// `beige users …`.
#[derive(Debug, clap::Subcommand)]
pub enum UsersCommand {
    /// The users of the config, their roles and channel identities
    List {
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Add a user, or change one: roles per agent, Telegram ids (edits the config)
    #[command(
        after_help = "Examples:\n  beige users add ops1 --role intern=operator --role '*=viewer' --telegram 123456789\n  beige users add ci --role 'build-*=member' --service\n\nOnly the config's users section is rewritten; the whole file is validated before it\nreplaces the old one. Restart the gateway to apply (beige gateway restart)."
    )]
    Add(UserAddArgs),
    /// Remove a user from the config (their tokens stop working)
    Remove {
        /// The user
        name: String,
    },
    /// Personal API tokens: create, list, revoke (through the running gateway)
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

/// `beige users add`.
#[derive(Debug, clap::Args)]
pub struct UserAddArgs {
    /// The user's name (lowercase letters, digits, '-', '_')
    pub name: String,
    /// A role on an agent or a glob of agents: AGENT=ROLE (viewer, member, operator; owner only on '*')
    #[arg(long = "role", value_name = "AGENT=ROLE", required = true)]
    pub roles: Vec<String>,
    /// A Telegram user id that is this user (repeatable)
    #[arg(long)]
    pub telegram: Vec<i64>,
    /// A service account: tokens only, no console
    #[arg(long)]
    pub service: bool,
}

/// `beige users token …`.
#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Make a token for a user; its secret is printed once
    #[command(
        after_help = "The token is bgt_<id>_<secret>; send it as Authorization: Bearer <token>. The gateway keeps\nonly a hash of the secret: store the token now, it cannot be shown again.\n\nExit codes:\n  1  the gateway refused (e.g. no such user)\n  2  wrong usage\n  3  the gateway is not running"
    )]
    Create(TokenCreateArgs),
    /// List tokens (without secrets)
    List {
        /// Only this user's
        user: Option<String>,
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by id: it stops working at once
    Revoke {
        /// The token's id (or the whole token)
        id: String,
    },
}

/// `beige users token create`.
#[derive(Debug, clap::Args)]
pub struct TokenCreateArgs {
    /// The user the token acts as
    pub user: String,
    /// A name to recognise it by
    #[arg(long, default_value = "cli")]
    pub name: String,
    /// Lifetime: a number with s, m, h or d (e.g. 30d); default: no expiry
    #[arg(long)]
    pub expires: Option<String>,
    /// Only these agents (comma-separated names or globs)
    #[arg(long, value_delimiter = ',')]
    pub agents: Vec<String>,
    /// At most this role on any agent (viewer, member, operator, owner)
    #[arg(long)]
    pub max_role: Option<Role>,
}

/// `beige users list`.
pub fn list(home: &BeigeHome, config: Option<&Path>, json: bool) -> Result<()> {
    let config = super::policy::load(home, config)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&config.users)?);
        return Ok(());
    }
    if config.users.is_empty() {
        println!("no users: the gateway's token (BEIGE_HOME/gateway.token) is the owner of everything.\nAdd a `users` section to the config to share the gateway (see docs/people.md).");
        return Ok(());
    }
    for (name, user) in &config.users {
        let roles: Vec<String> = user
            .roles
            .iter()
            .map(|(pattern, role)| format!("{pattern}={role}"))
            .collect();
        let mut line = format!("{name}  {}", roles.join(" "));
        if !user.telegram.is_empty() {
            let ids: Vec<String> = user.telegram.iter().map(i64::to_string).collect();
            line.push_str(&format!("  telegram:{}", ids.join(",")));
        }
        if user.service {
            line.push_str("  (service)");
        }
        println!("{line}");
    }
    Ok(())
}

/// `beige users add`: the user is added, or replaced when it exists.
pub fn add(home: &BeigeHome, config: Option<&Path>, args: &UserAddArgs) -> Result<()> {
    let mut user = beige_core::config::users::UserConfig {
        roles: Default::default(),
        telegram: args.telegram.clone(),
        service: args.service,
    };
    for entry in &args.roles {
        let (agent, role) = entry.split_once('=').ok_or_else(|| {
            Exit::new(
                2,
                format!("error: --role '{entry}': write AGENT=ROLE, e.g. --role intern=member"),
            )
        })?;
        let role: Role = role
            .trim()
            .parse()
            .map_err(|m: String| Exit::new(2, format!("error: --role '{entry}': {m}")))?;
        user.roles.insert(agent.trim().to_string(), role);
    }
    let existed = edit_user(home, config, &args.name, UserEdit::Set(user))?;
    println!(
        "{} user '{}'; restart the gateway to apply: beige gateway restart",
        if existed { "changed" } else { "added" },
        args.name
    );
    Ok(())
}

/// `beige users remove`.
pub fn remove(home: &BeigeHome, config: Option<&Path>, name: &str) -> Result<()> {
    let removed = edit_user(home, config, name, UserEdit::Remove)?;
    if !removed {
        return Err(Exit::new(
            1,
            format!("error: no user '{name}' in the config (see beige users list)"),
        )
        .into());
    }
    println!("removed user '{name}': their tokens stop working once the gateway restarts (beige gateway restart)");
    Ok(())
}

/// What `beige users add|remove` does to the config's text.
enum UserEdit {
    Set(beige_core::config::users::UserConfig),
    Remove,
}

/// Apply `edit` to user `name` in the config file: only that entry's text changes
/// (comments and layout elsewhere stay), the whole new file is validated, and it
/// replaces the old one through a temporary file beside it, keeping its mode. Nothing
/// is written when the result would be invalid. `Ok(false)`: there was no such user.
fn edit_user(
    home: &BeigeHome,
    explicit: Option<&Path>,
    name: &str,
    edit: UserEdit,
) -> Result<bool> {
    use crate::install::edit;
    let path = explicit
        .map(Path::to_path_buf)
        .unwrap_or_else(|| home.config_path());
    let existed = super::policy::load(home, explicit)?
        .users
        .contains_key(name);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Exit::new(
            super::policy::CONFIG,
            format!("error: cannot read {}: {e}", path.display()),
        )
    })?;
    let cannot = |e: edit::EditError| {
        Exit::new(
            super::policy::CONFIG,
            format!(
                "error: cannot edit {}: {}; edit its users section by hand",
                path.display(),
                e.0
            ),
        )
    };
    let new_text = match edit {
        UserEdit::Set(user) => {
            edit::set_member(&text, "users", name, &serde_json::to_value(&user)?).map_err(cannot)?
        }
        UserEdit::Remove => match edit::remove_member(&text, "users", name).map_err(cannot)? {
            Some(t) => t,
            None => return Ok(false),
        },
    };
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".config-edit-")
        .suffix(".json5")
        .tempfile_in(dir)?;
    std::io::Write::write_all(&mut tmp, new_text.as_bytes())?;
    if let Ok(meta) = std::fs::metadata(&path) {
        std::fs::set_permissions(tmp.path(), meta.permissions())?;
    }
    if let Err(e) = beige_core::config::Config::load(tmp.path(), home) {
        return Err(Exit::new(
            super::policy::CONFIG,
            format!(
                "error: the change would make the config invalid, so nothing was written:\n{e}"
            ),
        )
        .into());
    }
    tmp.persist(&path)
        .map_err(|e| Exit::new(1, format!("error: cannot replace {}: {e}", path.display())))?;
    Ok(existed)
}

/// Seconds in `30d`, `12h`, `90m`, `45s`.
fn parse_lifetime(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (number, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("--expires '{text}': use a number with s, m, h or d, e.g. 30d"))?;
    let factor = match unit {
        "s" | "" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("--expires '{text}': the unit must be s, m, h or d")),
    };
    n.checked_mul(factor)
        .filter(|s| *s > 0)
        .ok_or_else(|| format!("--expires '{text}' is out of range"))
}

/// `beige users token …`.
pub async fn token(target: &Target, command: &TokenCommand) -> Result<()> {
    let gw = target.remote()?;
    match command {
        TokenCommand::Create(args) => {
            let expires_in_secs = match &args.expires {
                Some(t) => {
                    Some(parse_lifetime(t).map_err(|m| Exit::new(2, format!("error: {m}")))?)
                }
                None => None,
            };
            let new = NewToken {
                user: args.user.clone(),
                name: args.name.clone(),
                expires_in_secs,
                scope: TokenScope {
                    agents: (!args.agents.is_empty()).then(|| args.agents.clone()),
                    max_role: args.max_role,
                },
            };
            let minted = gw
                .create_token(new)
                .await
                .map_err(|e| crate::client::gateway_exit(target, e))?;
            println!("{}", minted.token);
            eprintln!(
                "token {} for {} ('{}'): store it now, it is not shown again",
                minted.info.id, minted.info.user, minted.info.name
            );
        }
        TokenCommand::List { user, json } => {
            let tokens = gw
                .tokens(user.as_deref())
                .await
                .map_err(|e| crate::client::gateway_exit(target, e))?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&tokens)?);
            } else {
                print!("{}", tokens_text(&tokens));
            }
        }
        TokenCommand::Revoke { id } => {
            let info = gw
                .revoke_token(id)
                .await
                .map_err(|e| crate::client::gateway_exit(target, e))?;
            println!(
                "revoked token {} of {} ('{}')",
                info.id, info.user, info.name
            );
        }
    }
    Ok(())
}

fn tokens_text(tokens: &[TokenInfo]) -> String {
    if tokens.is_empty() {
        return "no tokens; make one with `beige users token create USER --name NAME`\n"
            .to_string();
    }
    let when = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
            .unwrap_or_else(|| ms.to_string())
    };
    let mut out = String::new();
    for t in tokens {
        let state = if t.revoked {
            "revoked".to_string()
        } else {
            match t.expires_ms {
                Some(e) => format!("expires {}", when(e)),
                None => "active".to_string(),
            }
        };
        let used = t.last_used_ms.map(when).unwrap_or_else(|| "never".into());
        out.push_str(&format!(
            "{}  {}  {}  {state}  last used {used}\n",
            t.id, t.user, t.name
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes() {
        assert_eq!(parse_lifetime("30d"), Ok(30 * 86_400));
        assert_eq!(parse_lifetime("90m"), Ok(5400));
        assert!(parse_lifetime("0d").is_err());
        assert!(parse_lifetime("3w").unwrap_err().contains("s, m, h or d"));
        assert!(parse_lifetime("soon").is_err());
    }
}
