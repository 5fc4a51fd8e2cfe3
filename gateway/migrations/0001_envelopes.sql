-- Envelopes the gateway created or was told about (fan-out children), and their history.
CREATE TABLE envelopes (
    id          text PRIMARY KEY,
    -- The envelope a fan-out child came from. No foreign key: a sidecar may report a child
    -- of an envelope the gateway never created.
    parent_id   text,
    tool        text,
    status      text NOT NULL CHECK (status IN ('pending', 'running', 'succeeded', 'failed')),
    progress    double precision NOT NULL DEFAULT 0,
    actor       text,
    route       jsonb NOT NULL DEFAULT '[]',
    result      jsonb,
    error       jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX envelopes_parent_id ON envelopes (parent_id) WHERE parent_id IS NOT NULL;

CREATE TABLE envelope_events (
    seq          bigserial PRIMARY KEY,
    envelope_id  text NOT NULL REFERENCES envelopes (id) ON DELETE CASCADE,
    actor        text,
    phase        text NOT NULL,
    progress     double precision NOT NULL,
    message      text,
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX envelope_events_envelope_id ON envelope_events (envelope_id, seq);
