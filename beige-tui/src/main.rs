//! `beige-tui` binary: thin wrapper over the library.
fn main() -> std::process::ExitCode {
    eprintln!("{}", beige_tui::NOT_YET);
    std::process::ExitCode::from(2)
}
