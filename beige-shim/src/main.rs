//! `beige-shim`: the static binary mounted read-only at `/beige/shim` in every sandbox.
//!
//! This file only chooses the role, from `argv[0]` or the first argument:
//!
//! | invocation | role |
//! |---|---|
//! | `beige-shim init` | PID 1 of the container ([`init`]) |
//! | `beige-shim op read\|write\|patch\|exec` | one core-tool operation, JSON in and out ([`op`]) |
//! | `beige-shim --version` | prints the version |
//! | `/tools/bin/<tool>` (a symlink) or `beige-shim tool <name>` | tool client (not yet) |
//!
//! It must stay free of C dependencies and of anything that needs NSS (user or host
//! name look-ups), so the statically linked build runs in any image.

mod fsutil;
mod init;
mod op;
mod sys;

use std::ffi::OsString;
use std::path::Path;

/// Names under which the binary acts on its first argument rather than as a tool.
const SHIM_NAMES: [&str; 2] = ["beige-shim", "shim"];

/// Exit code for a wrong invocation.
const EXIT_USAGE: i32 = 2;

fn main() {
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let rest: Vec<OsString> = args.collect();
    std::process::exit(dispatch(&argv0, &rest));
}

fn dispatch(argv0: &OsString, rest: &[OsString]) -> i32 {
    let invoked_as = Path::new(argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !invoked_as.is_empty() && !SHIM_NAMES.contains(&invoked_as.as_str()) {
        return tool_client(&invoked_as);
    }
    let rest: Vec<String> = rest
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match rest.first().map(String::as_str) {
        Some("init") => init::run(&rest[1..]),
        Some("op") => op::run(rest.get(1).map(String::as_str)),
        Some("tool") => tool_client(rest.get(1).map_or("", String::as_str)),
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

fn tool_client(tool: &str) -> i32 {
    eprintln!(
        "beige-shim: invoked as tool {tool:?}, but the tool-client role is not available in \
         this version of the shim.\n\n{}",
        usage()
    );
    EXIT_USAGE
}

fn usage() -> String {
    format!(
        "beige-shim {} — the in-sandbox helper of beige\n\n\
         usage:\n  \
         beige-shim init               run as PID 1 of the container\n  \
         beige-shim op <operation>     one operation ({}) — JSON request on stdin, JSON reply on stdout\n  \
         beige-shim --version          print the version",
        env!("CARGO_PKG_VERSION"),
        op::NAMES.join("|")
    )
}
