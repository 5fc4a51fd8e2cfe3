-- The namespace of the actors an envelope travels (issue 26: a report token reports only its
-- own namespace's envelopes, a namespace-limited client token reads only those). NULL for
-- envelopes stored before this migration: see "Gateway tokens" in docs/DESIGN.md §9.
ALTER TABLE envelopes ADD COLUMN IF NOT EXISTS namespace text;
