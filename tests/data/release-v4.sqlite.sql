-- A SQLite database as the previous release (schema v4, commit 3f55c5a) left it: its tables filled by
-- tests/data/make_release_db.py, dumped with sqlite3 .dump.
PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE meta (
	"key" VARCHAR(64) NOT NULL, 
	value TEXT NOT NULL, 
	PRIMARY KEY ("key")
);
INSERT INTO meta VALUES('schema_version','4');
CREATE TABLE sessions (
	"key" VARCHAR(255) NOT NULL, 
	platform VARCHAR(32) NOT NULL, 
	chat_id VARCHAR(255) NOT NULL, 
	user_id VARCHAR(255), 
	thread_id VARCHAR(255), 
	epoch INTEGER NOT NULL, 
	created_at FLOAT NOT NULL, 
	updated_at FLOAT NOT NULL, 
	PRIMARY KEY ("key")
);
INSERT INTO sessions VALUES('telegram:dm:100','telegram','100','100',NULL,0,1796335185.2086853981,1796335185.2086853981);
CREATE TABLE messages (
	id INTEGER NOT NULL, 
	session_key VARCHAR(255) NOT NULL, 
	epoch INTEGER NOT NULL, 
	role VARCHAR(16) NOT NULL, 
	content TEXT, 
	tool_calls TEXT, 
	tool_call_id VARCHAR(128), 
	run_id VARCHAR(64), 
	created_at FLOAT NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO messages VALUES(1,'telegram:dm:100',0,'user','hello',NULL,NULL,'run-1',1796335185.2174119949);
INSERT INTO messages VALUES(2,'telegram:dm:100',0,'assistant','Hi there!',NULL,NULL,'run-1',1796335185.2174119949);
CREATE TABLE inbox (
	id INTEGER NOT NULL, 
	dedupe_key VARCHAR(512) NOT NULL, 
	platform VARCHAR(32) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	session_key VARCHAR(255) NOT NULL, 
	payload TEXT NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	run_id VARCHAR(64), 
	created_at FLOAT NOT NULL, 
	updated_at FLOAT NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (dedupe_key)
);
INSERT INTO inbox VALUES(1,'telegram:u1','telegram','chat','telegram:dm:100','{"event":{"text":"hello"}}','done','run-1',1796335185.2066919803,1796335185.2174119949);
INSERT INTO inbox VALUES(2,'telegram:u2','telegram','chat','telegram:dm:100','{"event":{"text":"pending"}}','pending','run-2',1796335185.2199225425,1796335185.2199225425);
CREATE TABLE runs (
	id VARCHAR(64) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	source VARCHAR(255) NOT NULL, 
	session_key VARCHAR(255) NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	toolsets TEXT NOT NULL, 
	prompt TEXT NOT NULL, 
	deliver_to VARCHAR(512), 
	result TEXT, 
	error TEXT, 
	tool_calls TEXT, 
	model_calls INTEGER NOT NULL, 
	attempts INTEGER NOT NULL, 
	created_at FLOAT NOT NULL, 
	started_at FLOAT, 
	finished_at FLOAT, 
	model_seconds FLOAT, 
	ended_by VARCHAR(32), 
	PRIMARY KEY (id)
);
INSERT INTO runs VALUES('run-1','chat','telegram','telegram:dm:100','completed','["hermes-telegram"]','hello','telegram:100','Hi there!',NULL,'[]',1,1,1796335185.2066919803,1796335185.2086853981,1796335185.2174119949,0.0,'answer');
INSERT INTO runs VALUES('run-2','chat','telegram','telegram:dm:100','queued','["hermes-telegram"]','pending','telegram:100',NULL,NULL,'[]',0,0,1796335185.2199225425,NULL,NULL,NULL,NULL);
CREATE TABLE outbox (
	id INTEGER NOT NULL, 
	dedupe_key VARCHAR(512) NOT NULL, 
	run_id VARCHAR(64), 
	platform VARCHAR(32) NOT NULL, 
	chat_id VARCHAR(512) NOT NULL, 
	thread_id VARCHAR(255), 
	reply_to VARCHAR(255), 
	edit_message_id VARCHAR(255), 
	part_index INTEGER NOT NULL, 
	parts_total INTEGER NOT NULL, 
	text TEXT NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	attempts INTEGER NOT NULL, 
	next_attempt_at FLOAT NOT NULL, 
	platform_message_id VARCHAR(255), 
	last_error TEXT, 
	created_at FLOAT NOT NULL, 
	sent_at FLOAT, 
	lane VARCHAR(800) NOT NULL, 
	claimed_by VARCHAR(64), 
	claim_until FLOAT, 
	in_doubt INTEGER NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (dedupe_key)
);
INSERT INTO outbox VALUES(1,'run:run-1:0','run-1','telegram','100',NULL,NULL,NULL,0,1,'Hi there!','pending',0,1796335185.2174119949,NULL,NULL,1796335185.2174119949,NULL,'telegram:100',NULL,NULL,0);
CREATE TABLE memory (
	id INTEGER NOT NULL, 
	user_key VARCHAR(255) NOT NULL, 
	text TEXT NOT NULL, 
	created_at FLOAT NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO memory VALUES(1,'telegram:100','likes tea',1796335185.2203123569);
CREATE TABLE todos (
	session_key VARCHAR(255) NOT NULL, 
	items TEXT NOT NULL, 
	updated_at FLOAT NOT NULL, 
	PRIMARY KEY (session_key)
);
INSERT INTO todos VALUES('telegram:dm:100','[{"id":"1","content":"write tests","status":"pending"}]',1796335185.2209041118);
CREATE TABLE session_summaries (
	session_key VARCHAR(255) NOT NULL, 
	epoch INTEGER NOT NULL, 
	summary TEXT, 
	through_id INTEGER NOT NULL, 
	prompt_tokens INTEGER, 
	updated_at FLOAT NOT NULL, 
	PRIMARY KEY (session_key)
);
INSERT INTO session_summaries VALUES('telegram:dm:100',0,'earlier talk',1,NULL,1796335185.2219593524);
CREATE TABLE platform_state (
	"key" VARCHAR(255) NOT NULL, 
	value TEXT NOT NULL, 
	updated_at FLOAT NOT NULL, 
	PRIMARY KEY ("key")
);
INSERT INTO platform_state VALUES('discord:session','abc',1796335185.2229585648);
CREATE TABLE cron_jobs (
	id VARCHAR(16) NOT NULL, 
	owner VARCHAR(255) NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	prompt TEXT NOT NULL, 
	schedule TEXT NOT NULL, 
	timezone VARCHAR(64) NOT NULL, 
	origin_platform VARCHAR(32) NOT NULL, 
	origin_chat_id VARCHAR(255) NOT NULL, 
	origin_thread_id VARCHAR(255), 
	session_key VARCHAR(255), 
	repeat INTEGER, 
	deliver VARCHAR(512) NOT NULL, 
	notify VARCHAR(16) NOT NULL, 
	misfire VARCHAR(16) NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	fires INTEGER NOT NULL, 
	next_fire_at FLOAT, 
	last_fire_at FLOAT, 
	last_run_id VARCHAR(64), 
	last_status VARCHAR(16), 
	last_error TEXT, 
	last_result TEXT, 
	consecutive_failures INTEGER NOT NULL, 
	last_misfire TEXT, 
	paused_reason TEXT, 
	run_requested_at FLOAT, 
	created_at FLOAT NOT NULL, 
	updated_at FLOAT NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO cron_jobs VALUES('12abd82c','telegram:100','','daily digest','{"kind": "interval", "seconds": 86400, "start": "2026-11-02T09:00:00+00:00"}','UTC','telegram','100',NULL,NULL,NULL,'origin','always','run_once','active',0,1793523600.0,NULL,NULL,NULL,NULL,NULL,0,NULL,NULL,NULL,1796335185.2307779788,1796335185.230782032);
CREATE TABLE pairing_codes (
	code VARCHAR(16) NOT NULL, 
	platform VARCHAR(32) NOT NULL, 
	user_id VARCHAR(255) NOT NULL, 
	user_name VARCHAR(255), 
	chat_id VARCHAR(255) NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	created_at FLOAT NOT NULL, 
	expires_at FLOAT NOT NULL, 
	PRIMARY KEY (code)
);
INSERT INTO pairing_codes VALUES('8JKGQCLQ','telegram','200','bob','200','pending',1796335185.223833084,1796338785.223833084);
CREATE TABLE approved_users (
	platform VARCHAR(32) NOT NULL, 
	user_id VARCHAR(255) NOT NULL, 
	user_name VARCHAR(255), 
	approved_by VARCHAR(255) NOT NULL, 
	approved_at FLOAT NOT NULL, 
	PRIMARY KEY (platform, user_id)
);
CREATE TABLE pairing_failures (
	id INTEGER NOT NULL, 
	at FLOAT NOT NULL, 
	PRIMARY KEY (id)
);
CREATE INDEX ix_messages_session ON messages (session_key, epoch, id);
CREATE INDEX ix_inbox_status ON inbox (status, id);
CREATE INDEX ix_inbox_session ON inbox (session_key, status, id);
CREATE INDEX ix_outbox_lane ON outbox (lane, status, id);
CREATE INDEX ix_outbox_status ON outbox (status, id);
CREATE INDEX ix_memory_user_key ON memory (user_key);
CREATE INDEX ix_cron_jobs_owner ON cron_jobs (owner);
CREATE INDEX ix_pairing_user ON pairing_codes (platform, user_id);
COMMIT;
