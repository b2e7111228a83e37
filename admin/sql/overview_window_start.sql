-- The id after which every effect was created at or after $1: the newest effect created before $1, found by
-- walking the primary key down from the newest effect (reading the window's rows only; created_at has no
-- index of its own, so the gateway's insert path stays as it was). 0 when there is none.
SELECT COALESCE((SELECT id FROM oncegate_effects WHERE created_at < $1 ORDER BY id DESC LIMIT 1), 0)
