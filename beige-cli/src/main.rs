//! The `beige` command line. Parses arguments, sets up logging and hands off to
//! [`cmd`]; every error ends here as one message on stderr and a non-zero exit code
//! (1 unless the command chose another with [`Exit`]). Usage errors exit with 2 (clap).

mod cli;
mod client;
mod cmd;
mod daemon;
mod install;
mod logfile;
mod sys;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

/// An error that ends `beige` with a particular exit code. `message` (when not empty)
/// goes to stderr as is; the command has already printed anything else.
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub message: String,
}

impl Exit {
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// Exit with `code` without printing anything more.
    pub fn silent(code: u8) -> Self {
        Self::new(code, "")
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}

/// Exit codes shared by the commands that talk to a gateway.
pub mod code {
    /// The gateway is not running (also `gateway status` when stopped).
    pub const NOT_RUNNING: u8 = 3;
    /// No such agent.
    pub const UNKNOWN_AGENT: u8 = 4;
    /// Interrupted with Ctrl+C.
    pub const INTERRUPTED: u8 = 130;
}

fn main() -> ExitCode {
    quiet_broken_pipe();
    beige_core::return_large_allocations();
    let cli = cli::Cli::parse();
    let (foreground, log_file) = match &cli.command {
        Some(cli::Command::Gateway {
            command:
                Some(cli::GatewayCommand::Start {
                    foreground: true,
                    log_file,
                    log_max_size,
                    log_max_files,
                    ..
                }),
        }) => (
            true,
            log_file
                .as_deref()
                .map(|p| (p.to_path_buf(), *log_max_size, *log_max_files)),
        ),
        _ => (false, None),
    };
    init_logging(
        cli.log_level.as_deref(),
        if foreground { "info" } else { "warn" },
        foreground,
        log_file,
    );
    match cmd::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => match err.downcast_ref::<Exit>() {
            Some(exit) => {
                if !exit.message.is_empty() {
                    eprintln!("{}", exit.message);
                }
                ExitCode::from(exit.code)
            }
            None => {
                eprintln!("error: {err:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// `beige … | head` closes stdout early; printing then fails, which Rust reports as a
/// panic. End quietly instead, with the exit status a shell gives a process killed by
/// SIGPIPE (141); any other panic keeps the default report.
fn quiet_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.contains("Broken pipe") || message.contains("BrokenPipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

/// Logs go to stderr — or, for the daemon `gateway start` runs, to its `gateway.log`,
/// rotated by size while it runs: `--log-level` wins over `RUST_LOG`, else `default`.
/// The gateway in the foreground logs with timestamps; other commands print only the
/// message.
fn init_logging(
    level: Option<&str>,
    default: &str,
    timestamps: bool,
    log_file: Option<(std::path::PathBuf, u64, u32)>,
) {
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(level) => EnvFilter::new(level),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)),
    };
    if let Some((path, max_size, keep)) = log_file {
        match logfile::RotatingLog::open(&path, max_size, keep) {
            Ok(log) => {
                tracing_subscriber::fmt()
                    .with_env_filter(filter)
                    .with_writer(log)
                    .with_ansi(false)
                    .init();
                return;
            }
            Err(e) => eprintln!(
                "beige: cannot open {} for the log ({e}); logging to stderr without rotation",
                path.display()
            ),
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    if timestamps {
        builder.init();
    } else {
        builder.without_time().with_target(false).init();
    }
}
