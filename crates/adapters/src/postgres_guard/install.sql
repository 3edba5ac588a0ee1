-- Lethe's database guard for LangGraph on PostgreSQL, version 7. Run in one transaction by
-- `lethe guard install`; every statement is idempotent (CREATE ... IF NOT EXISTS, CREATE OR
-- REPLACE), so installing twice changes nothing. Everything lives in schema `lethe_guard`
-- except the triggers, which `lethe_guard.attach` creates on LangGraph's tables.
--
-- The three trigger functions run as the role that installed the guard (SECURITY DEFINER,
-- with search_path pinned to pg_catalog so that no object of the writer's can stand in for a
-- built-in): an application connecting as its own role needs no privilege on `lethe_guard`,
-- and cannot read or change the fence state. Without it, every write of such an application
-- failed ("permission denied for schema lethe_guard"). Measured with pgbench: +23 us of
-- latency and +5 us of CPU a write over a plain trigger (bench/README.md, "Guard").
--
-- Fence state holds no identifier in clear: owners are keyed digests of the tenant (and
-- subject), erased threads and store items keyed digests of their ids: HMAC-SHA256 under the
-- guard's key (`lethe_guard.key`, which `lethe guard install` writes from the deployment key)
-- of the SHA-256 that version 6 and earlier stored, so an older guard's state is keyed in place
-- (`set_key`). The same key checks the fencing tokens the gate issues (`issued`): a write's
-- `lethe_token` must be the gate's MAC over its lease, epoch and owner. The key table is read
-- only by the guard's own functions (the triggers run as its owner): an application role has no
-- right on the schema. Refusals raise SQLSTATE `LT001`..`LT005` with messages that name no
-- identifier.

SET LOCAL client_min_messages = warning;
CREATE SCHEMA IF NOT EXISTS lethe_guard;
COMMENT ON SCHEMA lethe_guard IS 'Lethe database guard: fences, epochs, erased threads and items (see lethe guard status)';

CREATE TABLE IF NOT EXISTS lethe_guard.meta (
    key text PRIMARY KEY,
    value text NOT NULL
);

-- The guard's key, as its two HMAC-SHA256 pads (64 bytes each; `GuardKey::pads`): one row,
-- written once by `set_key` (version 7). No grant: only the guard's SECURITY DEFINER functions
-- (running as the installing role) read it.
CREATE TABLE IF NOT EXISTS lethe_guard.key (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    ipad bytea NOT NULL CHECK (length(ipad) = 64),
    opad bytea NOT NULL CHECK (length(opad) = 64)
);
REVOKE ALL ON lethe_guard.key FROM PUBLIC;

-- One row per subject that a guarded job has fenced: the job's subject epoch, and whether its
-- job is between FROZEN and COMPLETE. `owner` = lethe_guard.subject_owner(key, tenant, subject).
CREATE TABLE IF NOT EXISTS lethe_guard.subject_fence (
    owner bytea PRIMARY KEY,
    epoch bigint NOT NULL,
    fenced boolean NOT NULL
);
CREATE INDEX IF NOT EXISTS subject_fence_closed ON lethe_guard.subject_fence (owner) WHERE fenced;

-- The same for tenant scopes (offboarding). `owner` = lethe_guard.tenant_owner(key, tenant).
CREATE TABLE IF NOT EXISTS lethe_guard.tenant_fence (
    owner bytea PRIMARY KEY,
    epoch bigint NOT NULL,
    fenced boolean NOT NULL
);
CREATE INDEX IF NOT EXISTS tenant_fence_closed ON lethe_guard.tenant_fence (owner) WHERE fenced;

-- Threads a job erased: never written again (thread ids are UUIDs; a new run takes a new one).
CREATE TABLE IF NOT EXISTS lethe_guard.erased_thread (
    thread bytea PRIMARY KEY
);

-- Store items a job erased. `forever`: erased by a memory scope, whose epoch does not move, so
-- no token can tell a stale writer from a fresh one. Otherwise a write carrying
-- `lethe_epoch >= epoch` (a lease taken after the erasure) may write the key again.
CREATE TABLE IF NOT EXISTS lethe_guard.erased_item (
    item bytea PRIMARY KEY,
    epoch bigint NOT NULL,
    forever boolean NOT NULL
);

-- Every digest the four tables above hold, in one index: the triggers' first test (see "One
-- probe first" below). Kept by the guard's own triggers on those tables, so every writer of
-- fence state keeps it; rows are only ever added (a digest left here when its row is gone costs
-- that owner's writes the full lookup, never an admission). Version 3; an install over
-- version 2 fills it from the tables (below, after the functions).
CREATE TABLE IF NOT EXISTS lethe_guard.known (
    d bytea PRIMARY KEY
);

-- Version 6's unkeyed digests, gone in version 7 (the keyed ones take the key as a first
-- argument; dropped here so no caller finds the old ones).
DROP FUNCTION IF EXISTS lethe_guard.tenant_owner(text);
DROP FUNCTION IF EXISTS lethe_guard.subject_owner(text, text);
DROP FUNCTION IF EXISTS lethe_guard.thread_digest(text);
DROP FUNCTION IF EXISTS lethe_guard.item_digest(text, text);
DROP FUNCTION IF EXISTS lethe_guard.check_owner(text, text, jsonb, jsonb, boolean);
DROP FUNCTION IF EXISTS lethe_guard.decide(bigint, boolean, bigint, boolean, jsonb, jsonb, boolean);

-- HMAC-SHA256 (RFC 2104) under the guard's key `g`, from its pads, with the built-in sha256:
-- no extension to install (pgcrypto's `hmac` computes the same; its schema and CREATE right
-- would be one more thing each database must have). Inlined where it is called.
CREATE OR REPLACE FUNCTION lethe_guard.mac(g lethe_guard.key, m bytea) RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT sha256(g.opad || sha256(g.ipad || m)) $$;

-- Digests: the MAC of version 6's SHA-256 of the identifier (so `set_key` keys an older
-- guard's digests in place). NUL cannot occur in text, so the encodings are injective. STABLE,
-- not IMMUTABLE, on purpose: convert_to is STABLE, and a SQL function declared more immutable
-- than its body is never inlined, which made every trigger call 3-4x slower (measured: 18 us vs
-- 5.5 us a lookup). `g` is the key row: a probe joins it once, a function reads it once
-- (`the_key`), Lethe's own statements pass `(SELECT g FROM lethe_guard.key g)`.
CREATE OR REPLACE FUNCTION lethe_guard.tenant_owner(g lethe_guard.key, tenant text) RETURNS bytea
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    AS $$ SELECT sha256(g.opad || sha256(g.ipad || sha256(convert_to(tenant, 'UTF8')))) $$;
CREATE OR REPLACE FUNCTION lethe_guard.subject_owner(g lethe_guard.key, tenant text, subject text) RETURNS bytea
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    AS $$ SELECT sha256(g.opad || sha256(g.ipad || sha256(convert_to(tenant, 'UTF8') || '\x00'::bytea || convert_to(subject, 'UTF8')))) $$;
CREATE OR REPLACE FUNCTION lethe_guard.thread_digest(g lethe_guard.key, thread text) RETURNS bytea
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    AS $$ SELECT sha256(g.opad || sha256(g.ipad || sha256(convert_to(thread, 'UTF8')))) $$;
CREATE OR REPLACE FUNCTION lethe_guard.item_digest(g lethe_guard.key, prefix text, key text) RETURNS bytea
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    AS $$ SELECT sha256(g.opad || sha256(g.ipad || sha256(convert_to(prefix, 'UTF8') || '\x00'::bytea || convert_to(key, 'UTF8')))) $$;

-- The key row, or a refusal: a guard without its key admits nothing it would have to judge
-- (every lookup would miss). Only the slow path calls it; the probes' join finds no row and
-- falls through to it.
CREATE OR REPLACE FUNCTION lethe_guard.the_key() RETURNS lethe_guard.key
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    gk lethe_guard.key;
BEGIN
    SELECT * INTO gk FROM lethe_guard.key;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lethe guard: the guard has no key; run `lethe guard install` again'
            USING ERRCODE = 'LT005';
    END IF;
    RETURN gk;
END $$;

-- Whether `token` (a write's `lethe_token`: `<lease>.<subject MAC>.<tenant MAC>`, as the gate
-- issues it with a lease, `GuardKey::token`) was issued for this owner at this epoch. `part`
-- 's': the subject MAC, over ('s', lease, epoch, tenant, subject); 't': the tenant MAC, over
-- ('t', lease, tenant epoch, tenant). Anything else (absent, not a string, malformed, another
-- lease's, another owner's, another epoch's) is false, never NULL.
CREATE OR REPLACE FUNCTION lethe_guard.issued(token jsonb, part text, epoch bigint, tenant text, subject text)
    RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    t text[];
    m bytea;
BEGIN
    IF token IS NULL OR jsonb_typeof(token) <> 'string' OR epoch IS NULL OR tenant IS NULL THEN
        RETURN false;
    END IF;
    t := string_to_array(token #>> '{}', '.');
    IF coalesce(array_length(t, 1), 0) <> 3 OR t[1] !~ '^[0-9]{1,18}$' THEN
        RETURN false;
    END IF;
    m := convert_to(part, 'UTF8') || '\x00'::bytea || convert_to(t[1], 'UTF8') || '\x00'::bytea
         || convert_to(epoch::text, 'UTF8') || '\x00'::bytea || convert_to(tenant, 'UTF8');
    IF part = 's' THEN
        IF subject IS NULL THEN
            RETURN false;
        END IF;
        RETURN coalesce(t[2] = encode(lethe_guard.mac(lethe_guard.the_key(), m || '\x00'::bytea || convert_to(subject, 'UTF8')), 'hex'), false);
    END IF;
    RETURN coalesce(t[3] = encode(lethe_guard.mac(lethe_guard.the_key(), m), 'hex'), false);
END $$;

-- Writes the guard's key (its pads), once. A guard keyed under another deployment key is
-- refused: its digests and the tokens it admits belong to that deployment. The first time, on
-- a guard of version 6 or earlier, every digest it holds (unkeyed SHA-256) is keyed in place,
-- after drawing a generation so that a snapshot from before sees itself stale (below, "Snapshots
-- older than a fence change").
CREATE OR REPLACE FUNCTION lethe_guard.set_key(i bytea, o bytea) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    gk lethe_guard.key;
BEGIN
    SELECT * INTO gk FROM lethe_guard.key;
    IF FOUND THEN
        IF gk.ipad <> i OR gk.opad <> o THEN
            RAISE EXCEPTION 'lethe guard: this guard was installed under another deployment key; its fences, erased lists and tokens belong to that deployment'
                USING ERRCODE = 'LT005';
        END IF;
        RETURN;
    END IF;
    INSERT INTO lethe_guard.key (ipad, opad) VALUES (i, o);
    gk := lethe_guard.the_key();
    UPDATE lethe_guard.gen_seen SET g = nextval('lethe_guard.gen');
    UPDATE lethe_guard.subject_fence SET owner = lethe_guard.mac(gk, owner);
    UPDATE lethe_guard.tenant_fence SET owner = lethe_guard.mac(gk, owner);
    UPDATE lethe_guard.erased_thread SET thread = lethe_guard.mac(gk, thread);
    UPDATE lethe_guard.erased_item SET item = lethe_guard.mac(gk, item);
    UPDATE lethe_guard.known SET d = lethe_guard.mac(gk, d);
END $$;

-- Digests are computed once, into a variable, before any lookup. Written into a WHERE or a
-- join condition, `owner = lethe_guard.subject_owner(gk, t, s)` is not a constant (convert_to is
-- STABLE), and on a small fence table the planner picks a sequential scan that hashes the
-- owner again for every row of the table: measured, 0.24 ms added to a single-row write with
-- 200 fence rows, against 0.04 ms with the digest in a variable (bench/README.md, "Guard").

-- `known` is kept by these triggers on the four state tables; TG_ARGV[0] names the digest column.
CREATE OR REPLACE FUNCTION lethe_guard.remember() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    -- One branch a table: PL/pgSQL resolves NEW's fields when a statement first runs.
    IF TG_ARGV[0] = 'owner' THEN
        INSERT INTO lethe_guard.known (d) VALUES (NEW.owner) ON CONFLICT (d) DO NOTHING;
    ELSIF TG_ARGV[0] = 'thread' THEN
        INSERT INTO lethe_guard.known (d) VALUES (NEW.thread) ON CONFLICT (d) DO NOTHING;
    ELSE
        INSERT INTO lethe_guard.known (d) VALUES (NEW.item) ON CONFLICT (d) DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER known AFTER INSERT ON lethe_guard.subject_fence
    FOR EACH ROW EXECUTE FUNCTION lethe_guard.remember('owner');
CREATE OR REPLACE TRIGGER known AFTER INSERT ON lethe_guard.tenant_fence
    FOR EACH ROW EXECUTE FUNCTION lethe_guard.remember('owner');
CREATE OR REPLACE TRIGGER known AFTER INSERT ON lethe_guard.erased_thread
    FOR EACH ROW EXECUTE FUNCTION lethe_guard.remember('thread');
CREATE OR REPLACE TRIGGER known AFTER INSERT ON lethe_guard.erased_item
    FOR EACH ROW EXECUTE FUNCTION lethe_guard.remember('item');
-- From version 2 (or a half-made 3): every digest already held. Idempotent.
INSERT INTO lethe_guard.known (d)
    SELECT owner FROM lethe_guard.subject_fence
    UNION SELECT owner FROM lethe_guard.tenant_fence
    UNION SELECT thread FROM lethe_guard.erased_thread
    UNION SELECT item FROM lethe_guard.erased_item
    ON CONFLICT (d) DO NOTHING;

-- Snapshots older than a fence change (version 4). A trigger reads the fence state with its
-- transaction's snapshot: a REPEATABLE READ transaction that took its snapshot before a fence
-- closed would never see it. Every change that adds fence state (a fence closed, threads or
-- items recorded as erased) first draws `gen` (a sequence: not transactional, so every
-- session sees the draw at once) and writes the number to `gen_seen` (transactional: seen once
-- committed, and only by snapshots taken after). `fresh()` compares them, inside the first
-- probe's statement; a write that finds them apart goes to `catch_up()`.
CREATE SEQUENCE IF NOT EXISTS lethe_guard.gen;
CREATE TABLE IF NOT EXISTS lethe_guard.gen_seen (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    g bigint NOT NULL
);
-- Install holds the guard's lock, so no change is half-written: this also repairs a draw whose
-- transaction died before it committed.
INSERT INTO lethe_guard.gen_seen (g) VALUES (coalesce(pg_sequence_last_value('lethe_guard.gen'::regclass), 0))
    ON CONFLICT (one) DO UPDATE SET g = EXCLUDED.g;
-- A snapshot taken before `gen_seen` had its row (before the guard was installed, or upgraded
-- to version 4) reads no row: that is older than every fence, never fresh (version 6; before,
-- the NULL comparison let such a write through on the fence tables its snapshot saw, empty;
-- found by review). For `catch_up()`. The triggers' first probes spell the same comparison out: called as a
-- function there, it cost a put about 20 points more (bench/README.md, "Guard"), spelled out
-- about 3-5 points, within this VM's noise.
CREATE OR REPLACE FUNCTION lethe_guard.fresh() RETURNS boolean
    LANGUAGE sql VOLATILE
    AS $$ SELECT coalesce((SELECT g FROM lethe_guard.gen_seen), -1) >= coalesce(pg_sequence_last_value('lethe_guard.gen'::regclass), 0) $$;
-- Either a change is being written (its transaction holds the guard's lock: wait for it, after
-- which READ COMMITTED statements see it), or this transaction's snapshot predates one: refuse
-- with a serialization failure, which the application retries in a new transaction.
CREATE OR REPLACE FUNCTION lethe_guard.catch_up() RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF coalesce(lethe_guard.fresh(), false) THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(7810777120470692452);  -- the guard's lock (mod.rs LOCK)
    IF NOT coalesce(lethe_guard.fresh(), false) AND current_setting('transaction_isolation') <> 'read committed' THEN
        -- With the lock, no change is being written. Either one committed since this snapshot,
        -- or a draw's transaction died before it committed (version 6: every such snapshot was
        -- refused until the next change; found by review). The row, set to the last draw: a
        -- change committed since makes PostgreSQL refuse the update (40001, concurrent update),
        -- and a dead draw is repaired, this snapshot then being as fresh as any. A snapshot
        -- older than the row (the guard installed since) finds none to update.
        UPDATE lethe_guard.gen_seen SET g = coalesce(pg_sequence_last_value('lethe_guard.gen'::regclass), 0);
        IF NOT FOUND THEN
            RAISE EXCEPTION 'lethe guard: this transaction''s snapshot is older than a fence; retry the transaction'
                USING ERRCODE = '40001';
        END IF;
    END IF;
END $$;

-- One probe first. Most writes belong to a thread, an item and an owner the guard knows nothing
-- of. For them the trigger's first statement, one primary-key probe of `known` with every digest
-- the write could be attributed to, admits the write; only a write with something to decide
-- goes on to the full lookup. The probe may over-match (a candidate owner is taken from the
-- template's positions without checking its literal labels; digests of different kinds share
-- the table), which only sends a write to the full lookup; it never admits a write the full
-- lookup would refuse, because every digest the full lookup could find is in `known`.
-- Why it matters: PL/pgSQL sets up each expression and each statement's executor state again in
-- every transaction, and LangGraph writes one row per transaction, so the number of expressions
-- and statements a write runs is most of its cost. Measured (bench/README.md, "Guard"), a
-- single-row store upsert from Python, both versions in the same run: +80 us with version 2's
-- lookup, +50 us with this probe, on a 390 us write.

-- A fencing token from a JSON value: NULL when absent, the integer otherwise; anything else is
-- refused (a malformed token is never read as "no token").
CREATE OR REPLACE FUNCTION lethe_guard.token(v jsonb) RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'number' OR (v #>> '{}') !~ '^[0-9]{1,18}$' THEN
        RAISE EXCEPTION 'lethe guard: malformed fencing token: lethe_epoch must be a non-negative integer'
            USING ERRCODE = 'LT002';
    END IF;
    RETURN (v #>> '{}')::bigint;
END $$;

-- The owner checks every guarded write goes through. `epoch` / `tenant_epoch` are the tokens the
-- write carries (lethe_epoch / lethe_tenant_epoch). A tenant or subject with no fence row was
-- never erased under the guard: its writes are admitted unchanged.
CREATE OR REPLACE FUNCTION lethe_guard.check_owner(
    tenant text, subject text, epoch jsonb, tenant_epoch jsonb, token jsonb, fence_only boolean
) RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    gk lethe_guard.key;
    d_tenant bytea; d_subject bytea;
    te bigint; tf boolean; se bigint; sf boolean;
BEGIN
    IF tenant IS NULL THEN
        RETURN;
    END IF;
    -- Digests first, once: see "Digests are computed once" above.
    gk := lethe_guard.the_key();
    d_tenant := lethe_guard.tenant_owner(gk, check_owner.tenant);
    d_subject := lethe_guard.subject_owner(gk, check_owner.tenant, check_owner.subject);
    -- One lookup, then the same decision as every other guarded write (`decide`, below).
    SELECT tfe.epoch, tfe.fenced, sfe.epoch, sfe.fenced INTO te, tf, se, sf
      FROM (SELECT 1) one
      LEFT JOIN lethe_guard.tenant_fence tfe ON tfe.owner = d_tenant
      LEFT JOIN lethe_guard.subject_fence sfe ON sfe.owner = d_subject;
    IF te IS NOT NULL OR se IS NOT NULL THEN
        PERFORM lethe_guard.decide(te, tf, se, sf, epoch, tenant_epoch, token, check_owner.tenant, check_owner.subject, fence_only);
    END IF;
END $$;


-- The decision for one write, from one lookup: raises the refusal or returns. No lookup of
-- fence state: those are done once, in one statement, by the trigger (one statement per row
-- keeps the guard's cost low; bench/README.md, "Guard"). A token is checked against the key
-- (`issued`) only for an owner that was erased, after its epoch is found current.
CREATE OR REPLACE FUNCTION lethe_guard.decide(
    t_epoch bigint, t_fenced boolean, s_epoch bigint, s_fenced boolean,
    epoch jsonb, tenant_epoch jsonb, token jsonb, tenant text, subject text, fence_only boolean
) RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    tok bigint;
BEGIN
    IF t_fenced THEN
        RAISE EXCEPTION 'lethe guard: an erasure of this tenant is running; no write is admitted until it completes'
            USING ERRCODE = 'LT001';
    END IF;
    IF s_fenced THEN
        RAISE EXCEPTION 'lethe guard: an erasure of this subject is running; no write is admitted until it completes'
            USING ERRCODE = 'LT001';
    END IF;
    IF fence_only THEN
        RETURN;
    END IF;
    IF t_epoch IS NOT NULL THEN
        tok := lethe_guard.token(tenant_epoch);
        IF tok IS NULL OR tok < t_epoch OR NOT lethe_guard.issued(token, 't', tok, tenant, NULL) THEN
            RAISE EXCEPTION 'lethe guard: stale, missing or unissued fencing token: this tenant was erased; take a new lease (lethe_tenant_epoch and lethe_token as the gate issued them)'
                USING ERRCODE = 'LT002';
        END IF;
    END IF;
    IF s_epoch IS NOT NULL THEN
        tok := lethe_guard.token(epoch);
        IF tok IS NULL OR tok < s_epoch OR NOT lethe_guard.issued(token, 's', tok, tenant, subject) THEN
            RAISE EXCEPTION 'lethe guard: stale, missing or unissued fencing token: this subject was erased; take a new lease (lethe_epoch and lethe_token as the gate issued them)'
                USING ERRCODE = 'LT002';
        END IF;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION lethe_guard.refuse_erased_thread(tid text) RETURNS void
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    d bytea;
BEGIN
    d := lethe_guard.thread_digest(lethe_guard.the_key(), tid);
    IF EXISTS (SELECT 1 FROM lethe_guard.erased_thread e WHERE e.thread = d) THEN
        RAISE EXCEPTION 'lethe guard: this thread was erased; a write would resurrect it (start a new thread)'
            USING ERRCODE = 'LT003';
    END IF;
END $$;

-- `checkpoints`: TG_ARGV = (tenant key, subject key) of checkpoints.metadata ('' if none).
-- The owner and the tokens travel in the metadata LangGraph copies from the run config.
CREATE OR REPLACE FUNCTION lethe_guard.checkpoints_guard() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t text;
    s text;
    erased boolean;
    gk lethe_guard.key;
    d_thread bytea; d_tenant bytea; d_subject bytea;
    te bigint; tf boolean; se bigint; sf boolean;
BEGIN
    -- One probe first (see above): the thread and the metadata's owner. The key row is joined
    -- in: no key, no row, NULL, and the write goes on to `the_key`'s refusal.
    IF (SELECT NOT EXISTS (SELECT 1 FROM lethe_guard.known k WHERE k.d = ANY (ARRAY[
            lethe_guard.thread_digest(kr, NEW.thread_id),
            lethe_guard.tenant_owner(kr, NEW.metadata ->> NULLIF(TG_ARGV[0], '')),
            lethe_guard.subject_owner(kr, NEW.metadata ->> NULLIF(TG_ARGV[0], ''), NEW.metadata ->> NULLIF(TG_ARGV[1], ''))]))
          FROM lethe_guard.key kr)
       AND coalesce((SELECT s.g FROM lethe_guard.gen_seen s), -1) >= coalesce(pg_sequence_last_value('lethe_guard.gen'::regclass), 0) THEN
        RETURN NEW;
    END IF;
    PERFORM lethe_guard.catch_up();
    IF TG_OP = 'UPDATE' AND NEW.thread_id = OLD.thread_id
       AND NEW.checkpoint IS NOT DISTINCT FROM OLD.checkpoint
       AND NEW.metadata IS NOT DISTINCT FROM OLD.metadata THEN
        RETURN NEW;
    END IF;
    IF TG_ARGV[0] <> '' THEN
        t := NEW.metadata ->> TG_ARGV[0];
        IF TG_ARGV[1] <> '' THEN
            s := NEW.metadata ->> TG_ARGV[1];
        END IF;
    END IF;
    gk := lethe_guard.the_key();
    d_thread := lethe_guard.thread_digest(gk, NEW.thread_id);
    d_tenant := lethe_guard.tenant_owner(gk, t);
    d_subject := lethe_guard.subject_owner(gk, t, s);
    SELECT EXISTS (SELECT 1 FROM lethe_guard.erased_thread e WHERE e.thread = d_thread),
           tfe.epoch, tfe.fenced, sfe.epoch, sfe.fenced
      INTO erased, te, tf, se, sf
      FROM (SELECT 1) one
      LEFT JOIN lethe_guard.tenant_fence tfe ON tfe.owner = d_tenant
      LEFT JOIN lethe_guard.subject_fence sfe ON sfe.owner = d_subject;
    IF erased THEN
        RAISE EXCEPTION 'lethe guard: this thread was erased; a write would resurrect it (start a new thread)'
            USING ERRCODE = 'LT003';
    END IF;
    IF te IS NOT NULL OR se IS NOT NULL THEN
        PERFORM lethe_guard.decide(te, tf, se, sf, NEW.metadata -> 'lethe_epoch', NEW.metadata -> 'lethe_tenant_epoch',
                                   NEW.metadata -> 'lethe_token', t, s, false);
    END IF;
    RETURN NEW;
END $$;

-- `checkpoint_blobs` and `checkpoint_writes` carry only the thread id. Erased threads are
-- refused by digest (one primary-key probe).
--
-- A task write (`checkpoint_writes`) names its checkpoint and is attributed to that
-- checkpoint's owner (one primary-key probe), so a fenced owner's writes are refused. A write
-- whose checkpoint is not there is admitted: under LangGraph's default (async) durability a
-- task's writes may commit before the checkpoint they name, on the same connection, so no
-- wait can tell that race from a refused checkpoint. (Limit, documented: a stale run that
-- starts a NEW thread has every checkpoint refused, but with async durability its tasks'
-- writes can land under a thread no checkpoint names. LangGraph never reads them; Lethe
-- cannot attribute them. `durability="sync"` closes it: the refused put stops the run first.)
--
-- Blobs are written in the same transaction as their checkpoint, before it, so a refused
-- checkpoint rolls them back; a blob of an existing thread is attributed through one
-- checkpoint of the thread, and refused while that owner's fence is closed.
CREATE OR REPLACE FUNCTION lethe_guard.thread_rows_guard() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    md jsonb;
    gk lethe_guard.key;
    d_thread bytea;
    erased boolean;
    tf boolean;
    sf boolean;
BEGIN
    -- One probe first (see above), for a deployment at rest: while no fence is closed, only an
    -- erased thread is refused here, and its digest is in `known`. While a fence is closed,
    -- the owner must be read from the checkpoint (below). No key row: NULL, the slow path.
    IF (SELECT NOT (EXISTS (SELECT 1 FROM lethe_guard.known k WHERE k.d = lethe_guard.thread_digest(kr, NEW.thread_id))
                    OR EXISTS (SELECT 1 FROM lethe_guard.subject_fence f WHERE f.fenced)
                    OR EXISTS (SELECT 1 FROM lethe_guard.tenant_fence f WHERE f.fenced))
          FROM lethe_guard.key kr)
       AND coalesce((SELECT s.g FROM lethe_guard.gen_seen s), -1) >= coalesce(pg_sequence_last_value('lethe_guard.gen'::regclass), 0) THEN
        RETURN NEW;
    END IF;
    PERFORM lethe_guard.catch_up();
    IF TG_OP = 'UPDATE' AND NEW IS NOT DISTINCT FROM OLD THEN
        RETURN NEW;
    END IF;
    IF TG_TABLE_SCHEMA = 'public' THEN
        -- The common case, one statement a row: is the thread erased, and is the owner of the
        -- checkpoint the row names (a task write) or of one checkpoint of its thread (a blob)
        -- fenced? The owner's digests are computed once, in the LATERAL subquery (its LIMIT
        -- keeps it from being flattened), never per fence row.
        gk := lethe_guard.the_key();
        d_thread := lethe_guard.thread_digest(gk, NEW.thread_id);
        IF TG_TABLE_NAME = 'checkpoint_writes' THEN
            SELECT EXISTS (SELECT 1 FROM lethe_guard.erased_thread e WHERE e.thread = d_thread),
                   tfe.fenced, sfe.fenced
              INTO erased, tf, sf
              FROM (SELECT 1) one
              LEFT JOIN LATERAL (
                    SELECT lethe_guard.tenant_owner(gk, c.metadata ->> TG_ARGV[0]) AS dt,
                           lethe_guard.subject_owner(gk, c.metadata ->> TG_ARGV[0], c.metadata ->> NULLIF(TG_ARGV[1], '')) AS ds
                      FROM public.checkpoints c
                     WHERE c.thread_id = NEW.thread_id AND c.checkpoint_ns = NEW.checkpoint_ns
                       AND c.checkpoint_id = NEW.checkpoint_id
                     LIMIT 1) d ON true
              LEFT JOIN lethe_guard.tenant_fence tfe ON tfe.fenced AND tfe.owner = d.dt
              LEFT JOIN lethe_guard.subject_fence sfe ON sfe.fenced AND sfe.owner = d.ds;
        ELSE
            SELECT EXISTS (SELECT 1 FROM lethe_guard.erased_thread e WHERE e.thread = d_thread),
                   tfe.fenced, sfe.fenced
              INTO erased, tf, sf
              FROM (SELECT 1) one
              LEFT JOIN LATERAL (
                    SELECT lethe_guard.tenant_owner(gk, c.metadata ->> TG_ARGV[0]) AS dt,
                           lethe_guard.subject_owner(gk, c.metadata ->> TG_ARGV[0], c.metadata ->> NULLIF(TG_ARGV[1], '')) AS ds
                      FROM public.checkpoints c
                     WHERE c.thread_id = NEW.thread_id
                     LIMIT 1) d ON true
              LEFT JOIN lethe_guard.tenant_fence tfe ON tfe.fenced AND tfe.owner = d.dt
              LEFT JOIN lethe_guard.subject_fence sfe ON sfe.fenced AND sfe.owner = d.ds;
        END IF;
        IF erased THEN
            RAISE EXCEPTION 'lethe guard: this thread was erased; a write would resurrect it (start a new thread)'
                USING ERRCODE = 'LT003';
        END IF;
        IF TG_ARGV[0] <> '' AND (tf OR sf) THEN
            PERFORM lethe_guard.decide(NULL, tf, NULL, sf, NULL, NULL, NULL, NULL, NULL, true);
        END IF;
        RETURN NEW;
    END IF;
    -- Another schema: the same rules, with the checkpoint read by a statement built for it.
    PERFORM lethe_guard.refuse_erased_thread(NEW.thread_id);
    IF TG_ARGV[0] = '' THEN
        RETURN NEW;
    END IF;
    IF TG_TABLE_NAME = 'checkpoint_writes' THEN
        EXECUTE format('SELECT metadata FROM %I.checkpoints WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3',
                       TG_TABLE_SCHEMA)
            INTO md USING NEW.thread_id, NEW.checkpoint_ns, NEW.checkpoint_id;
        PERFORM lethe_guard.check_owner(md ->> TG_ARGV[0], md ->> NULLIF(TG_ARGV[1], ''), NULL, NULL, NULL, true);
    ELSIF EXISTS (SELECT 1 FROM lethe_guard.subject_fence WHERE fenced)
          OR EXISTS (SELECT 1 FROM lethe_guard.tenant_fence WHERE fenced) THEN
        EXECUTE format('SELECT metadata FROM %I.checkpoints WHERE thread_id = $1 LIMIT 1', TG_TABLE_SCHEMA)
            INTO md USING NEW.thread_id;
        PERFORM lethe_guard.check_owner(md ->> TG_ARGV[0], md ->> NULLIF(TG_ARGV[1], ''), NULL, NULL, NULL, true);
    END IF;
    RETURN NEW;
END $$;

-- `store`: TG_ARGV = the namespace template's labels ('{tenant}', '{subject}' or a literal).
-- The owner is read from `prefix` exactly as the store adapter selects scopes; the tokens are
-- the reserved top-level keys `lethe_epoch` / `lethe_tenant_epoch` of the item's value.
CREATE OR REPLACE FUNCTION lethe_guard.store_guard() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    labels text[];
    a text;
    l text;
    t text;
    s text;
    at_subject boolean := false;
    cur bigint;
    forever boolean;
    tok bigint;
    gk lethe_guard.key;
    d_item bytea; d_tenant bytea; d_subject bytea;
    te bigint; tf boolean; se bigint; sf boolean;
BEGIN
    -- One probe first (see above): the item and its candidate owner, the labels at the
    -- template's {tenant} and {subject} positions (TG_ARGV is 0-based, labels 1-based). No key
    -- row: NULL, the slow path.
    IF (SELECT NOT EXISTS (SELECT 1 FROM lethe_guard.known k WHERE k.d = ANY (ARRAY[
            lethe_guard.item_digest(kr, NEW.prefix, NEW.key),
            lethe_guard.tenant_owner(kr, split_part(NEW.prefix, '.', array_position(TG_ARGV, '{tenant}') + 1)),
            lethe_guard.subject_owner(kr, split_part(NEW.prefix, '.', array_position(TG_ARGV, '{tenant}') + 1),
                                      split_part(NEW.prefix, '.', array_position(TG_ARGV, '{subject}') + 1))]))
          FROM lethe_guard.key kr)
       AND coalesce((SELECT s.g FROM lethe_guard.gen_seen s), -1) >= coalesce(pg_sequence_last_value('lethe_guard.gen'::regclass), 0) THEN
        RETURN NEW;
    END IF;
    PERFORM lethe_guard.catch_up();
    -- A TTL refresh (LangGraph updates expires_at on read) writes no memory.
    IF TG_OP = 'UPDATE' AND NEW.prefix = OLD.prefix AND NEW.key = OLD.key
       AND NEW.value IS NOT DISTINCT FROM OLD.value THEN
        RETURN NEW;
    END IF;
    labels := string_to_array(NEW.prefix, '.');
    FOR i IN 0 .. TG_NARGS - 1 LOOP
        a := TG_ARGV[i];
        l := labels[i + 1];
        IF NOT at_subject THEN
            IF a = '{subject}' THEN
                s := l;
                EXIT WHEN l IS NULL;
                at_subject := true;
            ELSIF l IS NULL THEN
                t := NULL;
                EXIT;
            ELSIF a = '{tenant}' THEN
                t := l;
            ELSIF a <> l THEN
                t := NULL;
                EXIT;
            END IF;
        ELSIF l IS NULL OR a <> l THEN
            s := NULL;
            EXIT;
        END IF;
    END LOOP;
    gk := lethe_guard.the_key();
    d_item := lethe_guard.item_digest(gk, NEW.prefix, NEW.key);
    d_tenant := lethe_guard.tenant_owner(gk, t);
    d_subject := lethe_guard.subject_owner(gk, t, s);
    SELECT e.epoch, e.forever, tfe.epoch, tfe.fenced, sfe.epoch, sfe.fenced
      INTO cur, forever, te, tf, se, sf
      FROM (SELECT 1) one
      LEFT JOIN lethe_guard.erased_item e ON e.item = d_item
      LEFT JOIN lethe_guard.tenant_fence tfe ON tfe.owner = d_tenant
      LEFT JOIN lethe_guard.subject_fence sfe ON sfe.owner = d_subject;
    IF cur IS NOT NULL THEN
        tok := lethe_guard.token(NEW.value -> 'lethe_epoch');
        IF forever OR tok IS NULL OR tok < cur OR NOT lethe_guard.issued(NEW.value -> 'lethe_token', 's', tok, t, s) THEN
            RAISE EXCEPTION 'lethe guard: this store item was erased; only a write under a lease taken after the erasure may write it again'
                USING ERRCODE = 'LT004';
        END IF;
    END IF;
    IF te IS NOT NULL OR se IS NOT NULL THEN
        PERFORM lethe_guard.decide(te, tf, se, sf, NEW.value -> 'lethe_epoch', NEW.value -> 'lethe_tenant_epoch',
                                   NEW.value -> 'lethe_token', t, s, false);
    END IF;
    RETURN NEW;
END $$;

-- Re-owning UPDATEs (version 5). The triggers above judge a row as the write leaves it (NEW). An
-- UPDATE that changes a row's owner keys or identity (checkpoints' owner in `metadata` or its
-- `thread_id`, a blob's or task write's `thread_id`, an item's `prefix` or `key`) also takes the
-- row away from its old owner, thread or item: while that owner's fence was closed it moved the
-- subject's rows out of the erasure, which then certified them gone (guard review). So such an
-- UPDATE is a write for both: the old row (OLD) goes through the same rules, with the tokens
-- the write carries (NEW's), and is refused with the same SQLSTATEs. A second trigger,
-- `lethe_guard_reown`, `BEFORE UPDATE` with a `WHEN` clause that compares those columns, so
-- INSERTs and every other UPDATE run exactly what they ran before (the clause is evaluated by
-- the executor, no function call). TG_ARGV = the main trigger's function, then its arguments.

-- `(tenant, subject)` of a store prefix under a namespace template, exactly as `store_guard`
-- reads them (which keeps its own inline copy: a function call there costs every write).
CREATE OR REPLACE FUNCTION lethe_guard.namespace_owner(prefix text, template text[],
                                                      OUT tenant text, OUT subject text)
    LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    labels text[] := string_to_array(prefix, '.');
    a text;
    l text;
    at_subject boolean := false;
BEGIN
    FOR i IN 1 .. coalesce(array_length(template, 1), 0) LOOP
        a := template[i];
        l := labels[i];
        IF NOT at_subject THEN
            IF a = '{subject}' THEN
                subject := l;
                EXIT WHEN l IS NULL;
                at_subject := true;
            ELSIF l IS NULL THEN
                tenant := NULL;
                EXIT;
            ELSIF a = '{tenant}' THEN
                tenant := l;
            ELSIF a <> l THEN
                tenant := NULL;
                EXIT;
            END IF;
        ELSIF l IS NULL OR a <> l THEN
            subject := NULL;
            EXIT;
        END IF;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION lethe_guard.reown_guard() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    args text[] := TG_ARGV[1:TG_NARGS - 1];
    o record;
    d_item bytea;
    cur bigint;
    forever boolean;
    tok bigint;
    owned boolean := false;
BEGIN
    PERFORM lethe_guard.catch_up();
    -- One branch a kind: PL/pgSQL resolves OLD's fields when a statement first runs.
    IF TG_ARGV[0] = 'store_guard' THEN
        d_item := lethe_guard.item_digest(lethe_guard.the_key(), OLD.prefix, OLD.key);
        SELECT e.epoch, e.forever INTO cur, forever FROM lethe_guard.erased_item e WHERE e.item = d_item;
        SELECT * INTO o FROM lethe_guard.namespace_owner(OLD.prefix, args);
        IF cur IS NOT NULL THEN
            tok := lethe_guard.token(NEW.value -> 'lethe_epoch');
            IF forever OR tok IS NULL OR tok < cur OR NOT lethe_guard.issued(NEW.value -> 'lethe_token', 's', tok, o.tenant, o.subject) THEN
                RAISE EXCEPTION 'lethe guard: this store item was erased; only a write under a lease taken after the erasure may write it again'
                    USING ERRCODE = 'LT004';
            END IF;
        END IF;
        PERFORM lethe_guard.check_owner(o.tenant, o.subject, NEW.value -> 'lethe_epoch', NEW.value -> 'lethe_tenant_epoch',
                                        NEW.value -> 'lethe_token', false);
    ELSIF TG_ARGV[0] = 'checkpoints_guard' THEN
        PERFORM lethe_guard.refuse_erased_thread(OLD.thread_id);
        IF args[1] <> '' THEN
            PERFORM lethe_guard.check_owner(OLD.metadata ->> args[1], OLD.metadata ->> NULLIF(args[2], ''),
                                            NEW.metadata -> 'lethe_epoch', NEW.metadata -> 'lethe_tenant_epoch',
                                            NEW.metadata -> 'lethe_token', false);
        END IF;
    ELSE
        -- A blob or task write leaving its thread: the thread's owners, as `thread_rows_guard`
        -- judges them (fences only: these rows carry no token), from every checkpoint of it.
        PERFORM lethe_guard.refuse_erased_thread(OLD.thread_id);
        IF args[1] <> '' THEN
            FOR o IN EXECUTE format('SELECT DISTINCT metadata ->> $2 AS tenant, metadata ->> $3 AS subject
                                       FROM %I.checkpoints WHERE thread_id = $1', TG_TABLE_SCHEMA)
                     USING OLD.thread_id, args[1], NULLIF(args[2], '') LOOP
                owned := true;
                PERFORM lethe_guard.check_owner(o.tenant, o.subject, NULL, NULL, NULL, true);
            END LOOP;
            -- A thread whose checkpoints are gone (deleted earlier in the same transaction, say)
            -- has no owner to judge the row by: while any erasure runs, its rows stay where
            -- they are, or a fenced subject's rows could be moved out of the erasure.
            IF NOT owned AND (EXISTS (SELECT 1 FROM lethe_guard.subject_fence f WHERE f.fenced)
                                OR EXISTS (SELECT 1 FROM lethe_guard.tenant_fence f WHERE f.fenced)) THEN
                RAISE EXCEPTION 'lethe guard: a row of a thread without checkpoints cannot move to another thread while an erasure is running'
                    USING ERRCODE = 'LT001';
            END IF;
        END IF;
    END IF;
    RETURN NEW;
END $$;

-- Creates (or replaces) the triggers `lethe_guard` and `lethe_guard_reown` on one table.
-- Identifiers and arguments are quoted here, never by the caller.
CREATE OR REPLACE FUNCTION lethe_guard.attach(tbl_schema text, tbl text, fn text, args text[])
    RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    moved text;
BEGIN
    IF fn NOT IN ('checkpoints_guard', 'thread_rows_guard', 'store_guard') THEN
        RAISE EXCEPTION 'lethe guard: unknown guard function';
    END IF;
    EXECUTE format('CREATE OR REPLACE TRIGGER lethe_guard BEFORE INSERT OR UPDATE ON %I.%I FOR EACH ROW EXECUTE FUNCTION lethe_guard.%I(%s)',
                   tbl_schema, tbl, fn,
                   coalesce((SELECT string_agg(quote_literal(x), ', ' ORDER BY n) FROM unnest(args) WITH ORDINALITY AS u(x, n)), ''));
    -- The columns whose change moves a row to another owner, thread or item.
    moved := CASE fn
        WHEN 'checkpoints_guard' THEN
            format('OLD.thread_id IS DISTINCT FROM NEW.thread_id
                    OR (OLD.metadata ->> %L) IS DISTINCT FROM (NEW.metadata ->> %L)
                    OR (OLD.metadata ->> %L) IS DISTINCT FROM (NEW.metadata ->> %L)',
                   coalesce(args[1], ''), coalesce(args[1], ''), coalesce(args[2], ''), coalesce(args[2], ''))
        WHEN 'thread_rows_guard' THEN 'OLD.thread_id IS DISTINCT FROM NEW.thread_id'
        ELSE 'OLD.prefix IS DISTINCT FROM NEW.prefix OR OLD.key IS DISTINCT FROM NEW.key'
    END;
    EXECUTE format('CREATE OR REPLACE TRIGGER lethe_guard_reown BEFORE UPDATE ON %I.%I FOR EACH ROW WHEN (%s) EXECUTE FUNCTION lethe_guard.reown_guard(%s)',
                   tbl_schema, tbl, moved,
                   (SELECT string_agg(quote_literal(x), ', ' ORDER BY n) FROM unnest(fn || args) WITH ORDINALITY AS u(x, n)));
END $$;

INSERT INTO lethe_guard.meta (key, value) VALUES ('version', '7')
    ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
