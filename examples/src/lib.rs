//! Placeholder so the package has a target.
