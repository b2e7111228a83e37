-- Whether an effect of a partition being retired gained an outbox row after keep_effects.sql said none had
-- (an operator's retry of an effect past retention, in the moment between): the partition, detached, is then
-- attached again rather than dropped, so that no outbox row is left without its effect.
SELECT EXISTS (SELECT FROM oncegate_outbox WHERE effect_id >= {{lower}} AND effect_id < {{upper}})
