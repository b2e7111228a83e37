-- Whether a partition of oncegate_effect_bodies past retention.payloads must be kept still: an effect of its
-- id range is on its way (an outbox row: its payload is still to be sent, or an operator retried it), or
-- finished less than retention.payloads ago ({{retention_ms}}; the effects' index on finished_at, in the
-- partition of effects of the same range). Unlike the effects', a partition of bodies goes while its effects
-- stay, and no key points at a body.
SELECT EXISTS (SELECT FROM oncegate_outbox WHERE effect_id >= {{lower}} AND effect_id < {{upper}})
    OR EXISTS (SELECT FROM oncegate_effects
               WHERE finished_at >= now() - make_interval(secs => {{retention_ms}}::double precision / 1000)
                   AND id >= {{lower}} AND id < {{upper}})
