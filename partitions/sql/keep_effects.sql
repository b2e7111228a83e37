-- Whether a partition of oncegate_effects past retention must be kept still: an effect in it is not terminal
-- (it has an outbox row: pending, retrying, leased, or retried by an operator; the outbox is probed over its
-- primary key for the partition's id range), or one finished less than retention ago (the partition's index
-- on finished_at, probed once). So an effect is kept for retention after it finished, as the row-by-row
-- purge kept it, and the partition goes when the last of its effects has.
SELECT EXISTS (SELECT FROM oncegate_outbox WHERE effect_id >= {{lower}} AND effect_id < {{upper}})
    OR EXISTS (SELECT FROM {{partition}}
               WHERE finished_at >= now() - make_interval(secs => {{retention_ms}}::double precision / 1000))
