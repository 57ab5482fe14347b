-- The console's sign-ins, held here so that signing out ends them: the cookie carries a random token, this
-- table its SHA-256 (a copy of the table signs nobody in), who it is and the token its forms must echo
-- (CSRF). A session ends at sign-out or at expires_at, whichever comes first.
CREATE TABLE IF NOT EXISTS saga.console_sessions (
    token_sha256 bytea       PRIMARY KEY,
    operator     text        NOT NULL,
    csrf         text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS console_sessions_expiry_idx ON saga.console_sessions (expires_at);
