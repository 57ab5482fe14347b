-- A search finds a saga by the start of a searchable field's value, whatever the case (operations/search.py):
-- the lowered values in byte order, so the keys that start with a text are one range of this index (the query,
-- orchestrator/store/operations/reads.py SEARCH_SQL, bounds that range itself: a LIKE with a parameter would
-- not use the index under a generic plan). Built in the migration's transaction: saga starts wait for it, about
-- a second per million keys.
CREATE INDEX IF NOT EXISTS search_keys_folded_idx ON saga.search_keys ((lower(value) COLLATE "C"));
