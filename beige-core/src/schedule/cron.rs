//! Cron expressions in a time zone: the next fire instant in UTC.
