//! `beige-shim`: the static binary mounted read-only at `/beige/shim` in every sandbox.
//!
//! This file only chooses the role, from `argv[0]` or the first argument:
//!
//! | invocation | role |
//! |---|---|
//! | `beige-shim init [--agent-user UID:GID] [--link unix\|attach\|off] [--egress proxy=PORT[,dns=synthetic][,transparent=PORT+PORT…]]` | PID 1 of the container ([`init`]); with an agent user, also the link to the gateway ([`link`]) that runs operations as that user, and with `--egress` the explicit egress proxy on `127.0.0.1:PORT` that relays agent connections to the gateway ([`egress`]), optionally the DNS stub on `127.0.0.1:53` that hands out synthetic addresses ([`dns`]) and transparent listeners on `0.0.0.0:PORT` for clients that dial them |
//! | `beige-shim op read\|write\|patch\|exec\|kill [--drop UID:GID]` | one core-tool operation (or the kill of a running `exec`), JSON in and out ([`op`]); `--drop` first applies the agent's privilege drop ([`privdrop`]) |
//! | `beige-shim tool <name> [args…]` | tool client for `<name>` ([`tool`]) |
//! | `beige-shim --version` | prints the version |
//! | invoked as `init` (a link named `init`) | PID 1, as `beige-shim init` |
//! | invoked under any other name, e.g. `/tools/bin/kv` (a symlink) | tool client for that name |
//!
//! It must stay free of C dependencies and of anything that needs NSS (user or host
//! name look-ups), so the statically linked build runs in any image.

mod ca;
mod dns;
mod egress;
mod fsutil;
mod init;
mod link;
mod op;
mod privdrop;
mod spawn;
mod sys;
mod tool;

use std::ffi::{OsStr, OsString};
use std::path::Path;

/// Names under which the binary acts on its first argument rather than as a tool.
const SHIM_NAMES: [&str; 2] = ["beige-shim", "shim"];

/// Exit code for a wrong invocation.
const EXIT_USAGE: i32 = 2;

fn main() {
    sys::return_large_allocations();
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let rest: Vec<OsString> = args.collect();
    std::process::exit(dispatch(&argv0, &rest));
}

fn dispatch(argv0: &OsStr, rest: &[OsString]) -> i32 {
    let invoked_as = Path::new(argv0).file_name().unwrap_or_default();
    let lossy = |args: &[OsString]| -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    };
    if invoked_as == "init" {
        return init::run(&lossy(rest));
    }
    if !invoked_as.is_empty() && !SHIM_NAMES.iter().any(|n| invoked_as == *n) {
        // `/tools/bin/<tool>`: every argument goes to the tool, `--help` included.
        return tool::run(invoked_as, rest);
    }
    match rest.first().and_then(|a| a.to_str()) {
        Some("init") => init::run(&lossy(&rest[1..])),
        Some("op") => op::run(&lossy(&rest[1..])),
        Some("tool") => match rest.get(1) {
            Some(name) if !name.is_empty() => tool::run(name, &rest[2..]),
            _ => {
                eprintln!("beige-shim tool: missing the tool name\n\n{}", usage());
                EXIT_USAGE
            }
        },
        Some("--version" | "-V") => {
            println!("beige-shim {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Some("--help" | "-h" | "help") => {
            println!("{}", usage());
            0
        }
        _ => {
            eprintln!("{}", usage());
            EXIT_USAGE
        }
    }
}

fn usage() -> String {
    format!(
        "beige-shim {} — the in-sandbox helper of beige\n\n\
         usage:\n  \
         beige-shim init [--agent-user UID:GID] [--link unix|attach|off]\n                  \
         [--egress proxy=PORT[,dns=synthetic][,transparent=PORT+PORT…]]\n                                \
         run as PID 1 of the container; with an agent user, also hold the link\n                                \
         to the gateway and run operations for it as that user; --egress:\n                                \
         also relay HTTP proxy clients of 127.0.0.1:PORT (CONNECT and\n                                \
         http:// requests) to the gateway over the link's socket; dns=synthetic:\n                                \
         answer DNS on 127.0.0.1:53 with synthetic 127.77.x.y addresses;\n                                \
         transparent=80+443: relay clients that dial those addresses on the\n                                \
         given ports to the gateway for the names behind them\n  \
         beige-shim op <operation> [--drop UID:GID]\n                                \
         one operation ({}) — JSON request on stdin, JSON reply on stdout;\n                                \
         --drop: first drop to that user, no capabilities, the seccomp filter\n  \
         beige-shim tool <tool> [args…] call a plugin tool through the gateway\n  \
         <tool> [args…]                 the same, when the shim is run under the tool's name\n  \
         beige-shim --version           print the version\n\n\
         {}",
        env!("CARGO_PKG_VERSION"),
        op::NAMES.join("|"),
        tool::USAGE
    )
}
