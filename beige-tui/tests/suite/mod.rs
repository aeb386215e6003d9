mod fake;
mod snapshots;
mod update;
