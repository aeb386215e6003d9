//! `beige-tui [agent] [-g|--gateway url]`: the terminal UI on its own (the same as
//! `beige tui`).

use std::process::ExitCode;

const USAGE: &str = "Usage: beige-tui [AGENT] [-g|--gateway URL]

Terminal UI for a running beige gateway (see docs/tui.md).

Arguments:
  AGENT                 the agent to talk to (default: the first configured one)

Options:
  -g, --gateway URL     the gateway's address (default: from BEIGE_HOME/config.json5)
  -h, --help            print this help
  -V, --version         print the version";

enum Parsed {
    Run {
        agent: Option<String>,
        url: Option<String>,
    },
    Exit(ExitCode),
}

fn parse(args: impl Iterator<Item = String>) -> Parsed {
    let mut agent = None;
    let mut url = std::env::var("BEIGE_GATEWAY")
        .ok()
        .filter(|u| !u.is_empty());
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Parsed::Exit(ExitCode::SUCCESS);
            }
            "-V" | "--version" => {
                println!("beige-tui {}", env!("CARGO_PKG_VERSION"));
                return Parsed::Exit(ExitCode::SUCCESS);
            }
            "-g" | "--gateway" => match args.next() {
                Some(u) => url = Some(u),
                None => {
                    eprintln!("beige-tui: {arg} needs a URL\n\n{USAGE}");
                    return Parsed::Exit(ExitCode::from(2));
                }
            },
            a if a.starts_with("--gateway=") => {
                url = Some(a.trim_start_matches("--gateway=").to_string())
            }
            a if a.starts_with('-') => {
                eprintln!("beige-tui: unknown option {a}\n\n{USAGE}");
                return Parsed::Exit(ExitCode::from(2));
            }
            a => {
                if agent.is_some() {
                    eprintln!("beige-tui: unexpected argument {a}\n\n{USAGE}");
                    return Parsed::Exit(ExitCode::from(2));
                }
                agent = Some(a.to_string());
            }
        }
    }
    Parsed::Run { agent, url }
}

fn main() -> ExitCode {
    let (agent, url) = match parse(std::env::args().skip(1)) {
        Parsed::Run { agent, url } => (agent, url),
        Parsed::Exit(code) => return code,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("beige-tui: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(beige_tui::run(agent, url)) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("beige-tui: {e}");
            ExitCode::FAILURE
        }
    }
}
