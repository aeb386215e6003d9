mod approvals;
mod fake;
mod snapshots;
mod update;
