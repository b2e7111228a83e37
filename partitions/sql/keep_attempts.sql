-- Whether a partition of oncegate_effect_attempts past retention must be kept still: it has an attempt of an
-- effect that is still stored (not yet purged: still retrying, or finished less than retention ago). The
-- attempts of an effect then stay as long as it does, as they did when its purge cascaded to them. Effect ids
-- only grow, so when every attempt in the partition is of an effect older than the oldest one stored the
-- answer is no at the cost of two index lookups; otherwise the partition's effect index is walked from there.
SELECT EXISTS (
    SELECT FROM {{partition}} a
    WHERE a.effect_id >= (SELECT min(id) FROM oncegate_effects)
        AND EXISTS (SELECT FROM oncegate_effects e WHERE e.id = a.effect_id)
)
