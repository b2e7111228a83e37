-- How a stored payload is read, in place of the payload placeholder of other statements: the text the client
-- sent (json), or for a row accepted before migration 00004, its jsonb printed.
COALESCE(e.payload, e.legacy_payload::json)
