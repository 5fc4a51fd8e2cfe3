-- Fan-in (docs/DESIGN.md §12): the branches of a flow's fan-out, keyed by the namespace the
-- report token names and the join id, so one namespace cannot write another's. A branch's
-- result is inserted once per index (a redelivered or duplicated one changes nothing); the
-- join is marked done in the same transaction that stores its last index or its first error.
CREATE TABLE IF NOT EXISTS fanin_joins (
    namespace   text NOT NULL,
    join_id     text NOT NULL,
    total       integer NOT NULL CHECK (total > 0),
    done_by     integer,
    failed      boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (namespace, join_id)
);
CREATE TABLE IF NOT EXISTS fanin_branches (
    namespace text NOT NULL,
    join_id   text NOT NULL,
    idx       integer NOT NULL CHECK (idx >= 0),
    result    jsonb,
    error     jsonb,
    PRIMARY KEY (namespace, join_id, idx),
    FOREIGN KEY (namespace, join_id) REFERENCES fanin_joins (namespace, join_id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS fanin_joins_finished_at ON fanin_joins (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS fanin_joins_created_at ON fanin_joins (created_at);
