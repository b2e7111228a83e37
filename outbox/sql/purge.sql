-- Retention: deletes up to $2 effects that became terminal before now - $1 ms. Their keys can be used again.
DELETE FROM oncegate_effects
WHERE id IN (
    SELECT id FROM oncegate_effects
    WHERE finished_at < now() - make_interval(secs => $1::double precision / 1000)
    ORDER BY finished_at
    LIMIT $2
)
