//! `beige audit export --format ocsf|otlp|jsonl [--since T] [--agent A] [--endpoint URL]
//! [--output FILE]`: the audit log, offline, for a SIEM or an OpenTelemetry collector.
//!
//! Reads the files `beige audit verify` reads, in the same order
//! ([`beige_core::audit::chain::log_files`]); the conversion is
//! [`beige_core::audit::export`]. Output goes to stdout, to `--output`, or (OTLP) in
//! batches to `--endpoint`. Warnings about skipped lines and the summary go to stderr.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;
use beige_core::audit::chain;
use beige_core::audit::export::{self, Exporter, Filter, Format, Piece};
use beige_core::home::BeigeHome;

use crate::cli::ExportFormat;
use crate::Exit;

/// How long one batch may take to send.
const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Exit status of bad usage (as `audit verify`).
const USAGE: u8 = 2;

fn usage(message: String) -> anyhow::Error {
    Exit::new(USAGE, format!("error: {message}")).into()
}

fn failure(message: impl std::fmt::Display) -> anyhow::Error {
    Exit::new(1, format!("error: {message}")).into()
}

/// Where the output goes.
enum Sink {
    Write(Box<dyn Write>),
    Post {
        client: reqwest::Client,
        url: reqwest::Url,
    },
}

pub async fn run(
    home: &BeigeHome,
    format: ExportFormat,
    since: Option<&str>,
    agent: Option<String>,
    endpoint: Option<&str>,
    output: Option<&Path>,
) -> Result<()> {
    let format = match format {
        ExportFormat::Jsonl => Format::Jsonl,
        ExportFormat::Ocsf => Format::Ocsf,
        ExportFormat::Otlp => Format::Otlp,
    };
    if endpoint.is_some() && format != Format::Otlp {
        return Err(usage(
            "--endpoint sends OTLP logs: use it with --format otlp (or drop it to print the export)"
                .into(),
        ));
    }
    let since = since
        .map(|t| export::parse_since(t, chrono::Utc::now()))
        .transpose()
        .map_err(|e| usage(e.to_string()))?;
    if agent.as_deref().is_some_and(str::is_empty) {
        return Err(usage(
            "--agent is empty: give an agent's name, or leave it out for every agent".into(),
        ));
    }
    let path = home.audit_log_path();
    let files = chain::log_files(&path);
    if files.is_empty() {
        return Err(failure(format!(
            "no audit log at {} yet — it is written when an agent's tools are first called.",
            path.display()
        )));
    }
    let mut sink = match (endpoint, output) {
        (Some(e), _) => Sink::Post {
            url: export::otlp_logs_url(e).map_err(|e| usage(e.to_string()))?,
            client: reqwest::Client::builder()
                .timeout(SEND_TIMEOUT)
                .build()
                .map_err(|e| failure(format!("cannot start an HTTP client ({e})")))?,
        },
        (None, Some(file)) => Sink::Write(Box::new(std::io::BufWriter::new(create_output(
            file, &files,
        )?))),
        (None, None) => Sink::Write(Box::new(std::io::BufWriter::new(std::io::stdout()))),
    };
    let mut exporter = Exporter::new(files, format, Filter { since, agent });
    let mut sent = 0u64;
    let mut result = Ok(());
    for piece in exporter.by_ref() {
        let chunk = match piece {
            Ok(Piece::Skipped(s)) => {
                eprintln!("warning: {s}; line skipped");
                continue;
            }
            Ok(Piece::Chunk(c)) => c,
            Err(e) => {
                result = Err(failure(e));
                break;
            }
        };
        let written = match &mut sink {
            Sink::Write(w) => writeln!(w, "{}", chunk.text).map_err(|e| write_error(e, output)),
            Sink::Post { client, url } => export::post_otlp(client, url, chunk.text, sent)
                .await
                .map_err(failure),
        };
        if let Err(e) = written {
            result = Err(e);
            break;
        }
        sent += chunk.records as u64;
    }
    if result.is_ok() {
        if let Sink::Write(w) = &mut sink {
            result = w.flush().map_err(|e| write_error(e, output));
        }
    }
    let summary = exporter.summary();
    let whole = if result.is_ok() {
        summary.exported
    } else {
        sent
    };
    eprintln!(
        "{whole} records exported, {} lines skipped{}",
        summary.skipped,
        match (endpoint, output) {
            (Some(_), _) => match &sink {
                Sink::Post { url, .. } => format!(" (sent to {url})"),
                Sink::Write(_) => String::new(),
            },
            (None, Some(file)) => format!(" (written to {})", file.display()),
            (None, None) => String::new(),
        }
    );
    result
}

fn write_error(e: std::io::Error, output: Option<&Path>) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        return Exit::silent(141).into();
    }
    match output {
        Some(file) => failure(format!(
            "cannot write {} ({e}); check its folder's permissions and free space",
            file.display()
        )),
        None => failure(format!("cannot write the export to stdout ({e})")),
    }
}

/// Create `file` (mode 0600, replacing what is there), refusing to overwrite the log.
fn create_output(file: &Path, inputs: &[PathBuf]) -> Result<std::fs::File> {
    if let Ok(target) = std::fs::canonicalize(file) {
        if inputs
            .iter()
            .any(|i| std::fs::canonicalize(i).is_ok_and(|i| i == target))
        {
            return Err(usage(format!(
                "--output {} is one of the audit log's own files; write the export somewhere else",
                file.display()
            )));
        }
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    options.open(file).map_err(|e| {
        failure(format!(
            "cannot create the output file {} ({e}); check that its folder exists and is writable",
            file.display()
        ))
    })
}
