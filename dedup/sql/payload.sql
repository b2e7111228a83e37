-- How a stored payload is read, in place of the payload placeholder of other statements: the text the client
-- sent (json), for a row accepted before migration 00004 its jsonb printed, and for an effect whose body is
-- kept apart (retention.payloads, migration 00025), its body's; NULL when that body expired.
COALESCE(e.payload, e.legacy_payload::json,
    (SELECT b.payload FROM oncegate_effect_bodies b WHERE b.effect_id = e.id))
