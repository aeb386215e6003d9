//! Anthropic Messages client (in progress).
