//! The PostgreSQL schema, one migration per version, numbered as SQLite's are
//! (`sqlite.rs`): migration N makes the same tables and columns as SQLite's N, so a
//! test can compare the two schemas. Differences of type only: `BIGINT` for SQLite's
//! `INTEGER`, `BOOLEAN` for its 0/1 flags, `JSONB` for session metadata, identity
//! columns for `AUTOINCREMENT`, a `rowid` identity column where SQLite's implicit rowid
//! orders rows, and a PL/pgSQL trigger for the plugin usage counters.

/// Entry `i` takes the database from version `i` to `i + 1`. Append new entries; never
/// edit a released one.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    r#"
    CREATE TABLE sessions (
        id        TEXT PRIMARY KEY NOT NULL,
        agent     TEXT NOT NULL,
        key       TEXT NOT NULL,
        parent_id TEXT REFERENCES sessions(id),
        title     TEXT,
        model     TEXT,
        created   BIGINT NOT NULL,
        updated   BIGINT NOT NULL,
        rowid     BIGINT GENERATED ALWAYS AS IDENTITY
    );
    CREATE INDEX sessions_by_agent ON sessions(agent, created);
    CREATE INDEX sessions_by_parent ON sessions(parent_id);

    CREATE TABLE session_keys (
        key             TEXT PRIMARY KEY NOT NULL,
        current_session TEXT REFERENCES sessions(id),
        "verbose"       BOOLEAN,
        streaming       BOOLEAN,
        model_override  TEXT,
        metadata        JSONB NOT NULL DEFAULT '{}',
        updated         BIGINT NOT NULL
    );
    CREATE INDEX session_keys_by_session ON session_keys(current_session);

    CREATE TABLE messages (
        id                 BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session_id         TEXT NOT NULL REFERENCES sessions(id),
        seq                BIGINT NOT NULL,
        sub                BIGINT NOT NULL DEFAULT 0,
        content            TEXT NOT NULL,
        model              TEXT,
        input_tokens       BIGINT,
        output_tokens      BIGINT,
        cache_read_tokens  BIGINT,
        cache_write_tokens BIGINT,
        summary            BOOLEAN NOT NULL DEFAULT false,
        compacted          BOOLEAN NOT NULL DEFAULT false,
        created            BIGINT NOT NULL,
        UNIQUE (session_id, seq, sub)
    );

    CREATE TABLE provider_health (
        model_key            TEXT PRIMARY KEY NOT NULL,
        cooldown_until       BIGINT,
        consecutive_failures BIGINT NOT NULL DEFAULT 0,
        last_error           TEXT,
        updated              BIGINT NOT NULL
    );

    CREATE TABLE channel_offsets (
        channel TEXT PRIMARY KEY NOT NULL,
        value   BIGINT NOT NULL,
        updated BIGINT NOT NULL
    );

    CREATE TABLE channel_seen (
        id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        channel   TEXT NOT NULL,
        update_id BIGINT NOT NULL,
        seen_at   BIGINT NOT NULL,
        UNIQUE (channel, update_id)
    );
    CREATE INDEX channel_seen_by_age ON channel_seen(channel, id);

    CREATE TABLE outbox (
        id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        channel         TEXT NOT NULL,
        payload         TEXT NOT NULL,
        attempts        BIGINT NOT NULL DEFAULT 0,
        next_attempt_at BIGINT NOT NULL,
        last_error      TEXT,
        created         BIGINT NOT NULL
    );
    CREATE INDEX outbox_due ON outbox(channel, next_attempt_at, id);

    CREATE TABLE plugin_kv (
        plugin  TEXT NOT NULL,
        scope   TEXT NOT NULL,
        key     TEXT COLLATE "C" NOT NULL,
        value   TEXT NOT NULL,
        updated BIGINT NOT NULL,
        PRIMARY KEY (plugin, scope, key)
    );
    "#,
    // 2: what each plugin holds per scope (entries, and bytes of keys plus values as
    // UTF-8), kept by one trigger on every write path.
    r#"
    CREATE TABLE plugin_kv_usage (
        plugin  TEXT NOT NULL,
        scope   TEXT NOT NULL,
        entries BIGINT NOT NULL,
        bytes   BIGINT NOT NULL,
        PRIMARY KEY (plugin, scope)
    );

    INSERT INTO plugin_kv_usage (plugin, scope, entries, bytes)
        SELECT plugin, scope, count(*), sum(octet_length(key) + octet_length(value))
        FROM plugin_kv GROUP BY plugin, scope;

    CREATE FUNCTION plugin_kv_usage_track() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP IN ('UPDATE', 'DELETE') THEN
            UPDATE plugin_kv_usage
                SET entries = entries - 1,
                    bytes = bytes - octet_length(OLD.key) - octet_length(OLD.value)
                WHERE plugin = OLD.plugin AND scope = OLD.scope;
            DELETE FROM plugin_kv_usage
                WHERE plugin = OLD.plugin AND scope = OLD.scope AND entries <= 0;
        END IF;
        IF TG_OP IN ('INSERT', 'UPDATE') THEN
            INSERT INTO plugin_kv_usage (plugin, scope, entries, bytes)
                VALUES (NEW.plugin, NEW.scope, 1,
                        octet_length(NEW.key) + octet_length(NEW.value))
                ON CONFLICT (plugin, scope) DO UPDATE
                    SET entries = plugin_kv_usage.entries + 1,
                        bytes = plugin_kv_usage.bytes + EXCLUDED.bytes;
        END IF;
        RETURN NULL;
    END
    $$;

    CREATE TRIGGER plugin_kv_usage_track AFTER INSERT OR UPDATE OR DELETE ON plugin_kv
        FOR EACH ROW EXECUTE FUNCTION plugin_kv_usage_track();
    "#,
    // 3: the cost ledger, one row per model call, with no foreign key to sessions.
    r#"
    CREATE TABLE usage (
        id                 BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        ts                 BIGINT NOT NULL,
        agent              TEXT NOT NULL,
        session_id         TEXT,
        session_key        TEXT,
        turn_id            TEXT,
        model              TEXT NOT NULL,
        input_tokens       BIGINT NOT NULL,
        output_tokens      BIGINT NOT NULL,
        cache_read_tokens  BIGINT NOT NULL,
        cache_write_tokens BIGINT NOT NULL,
        cost_micros        BIGINT NOT NULL,
        unpriced           BOOLEAN NOT NULL
    );
    CREATE INDEX usage_by_agent ON usage(agent, ts);
    CREATE INDEX usage_by_session ON usage(session_id);
    CREATE INDEX usage_by_ts ON usage(ts);
    "#,
    // 4: sub-agents: the lineage of each child session, and the parent of the session
    // a ledger row was spent in.
    r#"
    CREATE TABLE session_lineage (
        session_id        TEXT PRIMARY KEY NOT NULL REFERENCES sessions(id),
        parent_session_id TEXT NOT NULL REFERENCES sessions(id),
        depth             BIGINT NOT NULL,
        invoked_by_exec   TEXT,
        rights            TEXT NOT NULL,
        created           BIGINT NOT NULL
    );
    CREATE INDEX session_lineage_by_parent ON session_lineage(parent_session_id);
    ALTER TABLE usage ADD COLUMN parent_session_id TEXT;
    CREATE INDEX usage_by_parent ON usage(parent_session_id);
    "#,
    // 5: schedules, and one run per fire instant: UNIQUE(schedule_id, fire_at) makes a
    // second claim of an instant impossible, whichever gateway makes it.
    r#"
    CREATE TABLE schedules (
        id             TEXT COLLATE "C" PRIMARY KEY NOT NULL,
        agent          TEXT NOT NULL,
        owner          TEXT NOT NULL,
        spec           TEXT NOT NULL,
        tz             TEXT,
        kind           TEXT NOT NULL,
        payload        TEXT NOT NULL,
        session_mode   TEXT NOT NULL,
        deliver        TEXT,
        missed         TEXT NOT NULL,
        overlap        TEXT NOT NULL,
        budget         TEXT,
        tools          TEXT,
        state          TEXT NOT NULL,
        next_fire_at   BIGINT,
        policy_version TEXT,
        created_by     TEXT NOT NULL,
        created        BIGINT NOT NULL,
        updated        BIGINT NOT NULL
    );
    CREATE INDEX schedules_by_agent ON schedules(agent, id);
    CREATE INDEX schedules_due ON schedules(state, next_fire_at);

    CREATE TABLE schedule_runs (
        id           TEXT PRIMARY KEY NOT NULL,
        schedule_id  TEXT NOT NULL REFERENCES schedules(id),
        fire_at      BIGINT NOT NULL,
        missed_count BIGINT NOT NULL DEFAULT 0,
        status       TEXT NOT NULL,
        claimed_by   TEXT NOT NULL,
        started_at   BIGINT,
        finished_at  BIGINT,
        session_id   TEXT,
        exec_id      TEXT,
        cost_micros  BIGINT NOT NULL DEFAULT 0,
        summary      TEXT,
        error        TEXT,
        rowid        BIGINT GENERATED ALWAYS AS IDENTITY,
        UNIQUE (schedule_id, fire_at)
    );
    CREATE INDEX schedule_runs_by_status ON schedule_runs(status, fire_at);
    "#,
    // 6: per session, the revision of its messages and the totals a `SessionRecord`
    // reports, kept by every append.
    r#"
    ALTER TABLE sessions ADD COLUMN revision BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN message_count BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN input_tokens BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN output_tokens BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN cache_read_tokens BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN cache_write_tokens BIGINT NOT NULL DEFAULT 0;
    UPDATE sessions SET
        message_count = (SELECT count(*) FROM messages m
                         WHERE m.session_id = sessions.id AND NOT m.summary),
        input_tokens = (SELECT coalesce(sum(m.input_tokens), 0) FROM messages m
                        WHERE m.session_id = sessions.id),
        output_tokens = (SELECT coalesce(sum(m.output_tokens), 0) FROM messages m
                         WHERE m.session_id = sessions.id),
        cache_read_tokens = (SELECT coalesce(sum(m.cache_read_tokens), 0) FROM messages m
                             WHERE m.session_id = sessions.id),
        cache_write_tokens = (SELECT coalesce(sum(m.cache_write_tokens), 0) FROM messages m
                              WHERE m.session_id = sessions.id);
    "#,
    // 7: personal API tokens: the hash of the secret only, looked up by public id.
    r#"
    CREATE TABLE api_tokens (
        id            TEXT COLLATE "C" PRIMARY KEY NOT NULL,
        "user"        TEXT NOT NULL,
        name          TEXT NOT NULL,
        scope         TEXT NOT NULL,
        created       BIGINT NOT NULL,
        expires       BIGINT,
        last_used     BIGINT,
        revoked       BOOLEAN NOT NULL DEFAULT false,
        secret_sha256 TEXT NOT NULL
    );
    CREATE INDEX api_tokens_by_user ON api_tokens("user", created);
    "#,
    // 8: leases of gateways that share the database: one row per lease, kept after
    // release; epochs only grow; `expires_at` in ms of the server's clock.
    r#"
    CREATE TABLE leases (
        name       TEXT PRIMARY KEY NOT NULL,
        holder     TEXT,
        epoch      BIGINT NOT NULL DEFAULT 0,
        expires_at BIGINT NOT NULL
    );
    "#,
    // 9: the answers of prompts sent with an idempotency key, written in their turn's
    // transaction; kept a day, pruned by `created` at each write.
    r#"
    CREATE TABLE prompt_answers (
        agent              TEXT NOT NULL,
        session_key        TEXT NOT NULL,
        idem_key           TEXT NOT NULL,
        request_sha256     TEXT NOT NULL,
        session_id         TEXT NOT NULL,
        response           TEXT NOT NULL,
        input_tokens       BIGINT NOT NULL,
        output_tokens      BIGINT NOT NULL,
        cache_read_tokens  BIGINT NOT NULL,
        cache_write_tokens BIGINT NOT NULL,
        created            BIGINT NOT NULL,
        PRIMARY KEY (agent, session_key, idem_key)
    );
    CREATE INDEX prompt_answers_by_created ON prompt_answers(created);
    "#,
];
