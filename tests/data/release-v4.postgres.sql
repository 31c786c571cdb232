-- A PostgreSQL database as the previous release (schema v4, commit 3f55c5a) left it: its tables filled by
-- tests/data/make_release_db.py, dumped with pg_dump --inserts --no-owner --no-privileges (psql settings removed).


CREATE TABLE public.approved_users (
    platform character varying(32) NOT NULL,
    user_id character varying(255) NOT NULL,
    user_name character varying(255),
    approved_by character varying(255) NOT NULL,
    approved_at double precision NOT NULL
);

CREATE TABLE public.cron_jobs (
    id character varying(16) NOT NULL,
    owner character varying(255) NOT NULL,
    name character varying(200) NOT NULL,
    prompt text NOT NULL,
    schedule text NOT NULL,
    timezone character varying(64) NOT NULL,
    origin_platform character varying(32) NOT NULL,
    origin_chat_id character varying(255) NOT NULL,
    origin_thread_id character varying(255),
    session_key character varying(255),
    repeat integer,
    deliver character varying(512) NOT NULL,
    notify character varying(16) NOT NULL,
    misfire character varying(16) NOT NULL,
    state character varying(16) NOT NULL,
    fires integer NOT NULL,
    next_fire_at double precision,
    last_fire_at double precision,
    last_run_id character varying(64),
    last_status character varying(16),
    last_error text,
    last_result text,
    consecutive_failures integer NOT NULL,
    last_misfire text,
    paused_reason text,
    run_requested_at double precision,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL
);

CREATE TABLE public.inbox (
    id integer NOT NULL,
    dedupe_key character varying(512) NOT NULL,
    platform character varying(32) NOT NULL,
    kind character varying(16) NOT NULL,
    session_key character varying(255) NOT NULL,
    payload text NOT NULL,
    status character varying(16) NOT NULL,
    run_id character varying(64),
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL
);

CREATE SEQUENCE public.inbox_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.inbox_id_seq OWNED BY public.inbox.id;

CREATE TABLE public.memory (
    id integer NOT NULL,
    user_key character varying(255) NOT NULL,
    text text NOT NULL,
    created_at double precision NOT NULL
);

CREATE SEQUENCE public.memory_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.memory_id_seq OWNED BY public.memory.id;

CREATE TABLE public.messages (
    id integer NOT NULL,
    session_key character varying(255) NOT NULL,
    epoch integer NOT NULL,
    role character varying(16) NOT NULL,
    content text,
    tool_calls text,
    tool_call_id character varying(128),
    run_id character varying(64),
    created_at double precision NOT NULL
);

CREATE SEQUENCE public.messages_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.messages_id_seq OWNED BY public.messages.id;

CREATE TABLE public.meta (
    key character varying(64) NOT NULL,
    value text NOT NULL
);

CREATE TABLE public.outbox (
    id integer NOT NULL,
    dedupe_key character varying(512) NOT NULL,
    run_id character varying(64),
    platform character varying(32) NOT NULL,
    chat_id character varying(512) NOT NULL,
    thread_id character varying(255),
    reply_to character varying(255),
    edit_message_id character varying(255),
    part_index integer NOT NULL,
    parts_total integer NOT NULL,
    text text NOT NULL,
    status character varying(16) NOT NULL,
    attempts integer NOT NULL,
    next_attempt_at double precision NOT NULL,
    platform_message_id character varying(255),
    last_error text,
    created_at double precision NOT NULL,
    sent_at double precision,
    lane character varying(800) NOT NULL,
    claimed_by character varying(64),
    claim_until double precision,
    in_doubt integer NOT NULL
);

CREATE SEQUENCE public.outbox_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.outbox_id_seq OWNED BY public.outbox.id;

CREATE TABLE public.pairing_codes (
    code character varying(16) NOT NULL,
    platform character varying(32) NOT NULL,
    user_id character varying(255) NOT NULL,
    user_name character varying(255),
    chat_id character varying(255) NOT NULL,
    status character varying(16) NOT NULL,
    created_at double precision NOT NULL,
    expires_at double precision NOT NULL
);

CREATE TABLE public.pairing_failures (
    id integer NOT NULL,
    at double precision NOT NULL
);

CREATE SEQUENCE public.pairing_failures_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.pairing_failures_id_seq OWNED BY public.pairing_failures.id;

CREATE TABLE public.platform_state (
    key character varying(255) NOT NULL,
    value text NOT NULL,
    updated_at double precision NOT NULL
);

CREATE TABLE public.runs (
    id character varying(64) NOT NULL,
    kind character varying(16) NOT NULL,
    source character varying(255) NOT NULL,
    session_key character varying(255) NOT NULL,
    status character varying(16) NOT NULL,
    toolsets text NOT NULL,
    prompt text NOT NULL,
    deliver_to character varying(512),
    result text,
    error text,
    tool_calls text,
    model_calls integer NOT NULL,
    attempts integer NOT NULL,
    created_at double precision NOT NULL,
    started_at double precision,
    finished_at double precision,
    model_seconds double precision,
    ended_by character varying(32)
);

CREATE TABLE public.session_summaries (
    session_key character varying(255) NOT NULL,
    epoch integer NOT NULL,
    summary text,
    through_id integer NOT NULL,
    prompt_tokens integer,
    updated_at double precision NOT NULL
);

CREATE TABLE public.sessions (
    key character varying(255) NOT NULL,
    platform character varying(32) NOT NULL,
    chat_id character varying(255) NOT NULL,
    user_id character varying(255),
    thread_id character varying(255),
    epoch integer NOT NULL,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL
);

CREATE TABLE public.todos (
    session_key character varying(255) NOT NULL,
    items text NOT NULL,
    updated_at double precision NOT NULL
);

ALTER TABLE ONLY public.inbox ALTER COLUMN id SET DEFAULT nextval('public.inbox_id_seq'::regclass);

ALTER TABLE ONLY public.memory ALTER COLUMN id SET DEFAULT nextval('public.memory_id_seq'::regclass);

ALTER TABLE ONLY public.messages ALTER COLUMN id SET DEFAULT nextval('public.messages_id_seq'::regclass);

ALTER TABLE ONLY public.outbox ALTER COLUMN id SET DEFAULT nextval('public.outbox_id_seq'::regclass);

ALTER TABLE ONLY public.pairing_failures ALTER COLUMN id SET DEFAULT nextval('public.pairing_failures_id_seq'::regclass);

INSERT INTO public.cron_jobs VALUES ('54de9656', 'telegram:100', '', 'daily digest', '{"kind": "interval", "seconds": 86400, "start": "2026-11-02T09:00:00+00:00"}', 'UTC', 'telegram', '100', NULL, NULL, NULL, 'origin', 'always', 'run_once', 'active', 0, 1793523600, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, 1796335193.529938, 1796335193.529941);

INSERT INTO public.inbox VALUES (1, 'telegram:u1', 'telegram', 'chat', 'telegram:dm:100', '{"event":{"text":"hello"}}', 'done', 'run-1', 1796335193.433762, 1796335193.4576232);
INSERT INTO public.inbox VALUES (2, 'telegram:u2', 'telegram', 'chat', 'telegram:dm:100', '{"event":{"text":"pending"}}', 'pending', 'run-2', 1796335193.475124, 1796335193.475124);

INSERT INTO public.memory VALUES (1, 'telegram:100', 'likes tea', 1796335193.4840236);

INSERT INTO public.messages VALUES (1, 'telegram:dm:100', 0, 'user', 'hello', NULL, NULL, 'run-1', 1796335193.4576232);
INSERT INTO public.messages VALUES (2, 'telegram:dm:100', 0, 'assistant', 'Hi there!', NULL, NULL, 'run-1', 1796335193.4576232);

INSERT INTO public.meta VALUES ('schema_version', '4');

INSERT INTO public.outbox VALUES (1, 'run:run-1:0', 'run-1', 'telegram', '100', NULL, NULL, NULL, 0, 1, 'Hi there!', 'pending', 0, 1796335193.4576232, NULL, NULL, 1796335193.4576232, NULL, 'telegram:100', NULL, NULL, 0);

INSERT INTO public.pairing_codes VALUES ('A59PRCRR', 'telegram', '200', 'bob', '200', 'pending', 1796335193.5136044, 1796338793.5136044);

INSERT INTO public.platform_state VALUES ('discord:session', 'abc', 1796335193.5056074);

INSERT INTO public.runs VALUES ('run-1', 'chat', 'telegram', 'telegram:dm:100', 'completed', '["hermes-telegram"]', 'hello', 'telegram:100', 'Hi there!', NULL, '[]', 1, 1, 1796335193.433762, 1796335193.4456494, 1796335193.4576232, 0, 'answer');
INSERT INTO public.runs VALUES ('run-2', 'chat', 'telegram', 'telegram:dm:100', 'queued', '["hermes-telegram"]', 'pending', 'telegram:100', NULL, NULL, '[]', 0, 0, 1796335193.475124, NULL, NULL, NULL, NULL);

INSERT INTO public.session_summaries VALUES ('telegram:dm:100', 0, 'earlier talk', 1, NULL, 1796335193.4898286);

INSERT INTO public.sessions VALUES ('telegram:dm:100', 'telegram', '100', '100', NULL, 0, 1796335193.4456494, 1796335193.4456494);

INSERT INTO public.todos VALUES ('telegram:dm:100', '[{"id":"1","content":"write tests","status":"pending"}]', 1796335193.4868832);

SELECT pg_catalog.setval('public.inbox_id_seq', 2, true);

SELECT pg_catalog.setval('public.memory_id_seq', 1, true);

SELECT pg_catalog.setval('public.messages_id_seq', 2, true);

SELECT pg_catalog.setval('public.outbox_id_seq', 1, true);

SELECT pg_catalog.setval('public.pairing_failures_id_seq', 1, false);

ALTER TABLE ONLY public.approved_users
    ADD CONSTRAINT approved_users_pkey PRIMARY KEY (platform, user_id);

ALTER TABLE ONLY public.cron_jobs
    ADD CONSTRAINT cron_jobs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.inbox
    ADD CONSTRAINT inbox_dedupe_key_key UNIQUE (dedupe_key);

ALTER TABLE ONLY public.inbox
    ADD CONSTRAINT inbox_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.memory
    ADD CONSTRAINT memory_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.messages
    ADD CONSTRAINT messages_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.meta
    ADD CONSTRAINT meta_pkey PRIMARY KEY (key);

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_dedupe_key_key UNIQUE (dedupe_key);

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.pairing_codes
    ADD CONSTRAINT pairing_codes_pkey PRIMARY KEY (code);

ALTER TABLE ONLY public.pairing_failures
    ADD CONSTRAINT pairing_failures_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.platform_state
    ADD CONSTRAINT platform_state_pkey PRIMARY KEY (key);

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.session_summaries
    ADD CONSTRAINT session_summaries_pkey PRIMARY KEY (session_key);

ALTER TABLE ONLY public.sessions
    ADD CONSTRAINT sessions_pkey PRIMARY KEY (key);

ALTER TABLE ONLY public.todos
    ADD CONSTRAINT todos_pkey PRIMARY KEY (session_key);

CREATE INDEX ix_cron_jobs_owner ON public.cron_jobs USING btree (owner);

CREATE INDEX ix_inbox_session ON public.inbox USING btree (session_key, status, id);

CREATE INDEX ix_inbox_status ON public.inbox USING btree (status, id);

CREATE INDEX ix_memory_user_key ON public.memory USING btree (user_key);

CREATE INDEX ix_messages_session ON public.messages USING btree (session_key, epoch, id);

CREATE INDEX ix_outbox_lane ON public.outbox USING btree (lane, status, id);

CREATE INDEX ix_outbox_status ON public.outbox USING btree (status, id);

CREATE INDEX ix_pairing_user ON public.pairing_codes USING btree (platform, user_id);
